"""The benchmark suite (`python -m bench`): latency, footprint, idle cost, start-up and drain.

Not timed tests: it measures the real bridge (as a `maintenance-bridge run` process where
the process matters) against the built-in simulator and a webhook receiver on loopback, next
to the vendors' own sample loops, and writes `report.md` and `latency.png`.
"""
