"""The fleet dashboard: an HTML page on the fleet service's listener, at `/`.

Server-rendered (`render`, from the data shaped in `views`), so every table reads without
JavaScript; one small script (`static/dashboard.js`) ticks the countdowns and swaps in a
fresh render when the store changed. The CSS, the script and the page template are package
data: nothing is fetched from elsewhere, so it works in an air-gapped network.
`routes.DashboardRoutes` registers it (`bridge.fleet.service`).
"""
