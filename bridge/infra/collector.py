"""CPython's garbage collector set for a service that answers many small requests at once.

The collector's first generation is collected each time 700 more container objects were
made than freed. A service with dozens of requests in flight passes that many times a second
while each request's objects (the request, its headers, its task and coroutines, its
futures) are still alive: every such collection scans them and promotes them to the older
generations, which then fill up and trigger full collections of everything the process
holds (tens of milliseconds each, the event loop stopped meanwhile). Measured on the fleet
service under 64 senders of one-event posts (`python -m bench.fleet_posts`): 24 us of CPU
per post in the collector, and near none with `settle`.

`settle`, once the service has started: collect what start-up left over, freeze the rest
(modules, configuration, routes: alive for the whole run, never scanned again), and raise
the first generation's threshold so that it is passed by real growth rather than by the
requests in flight. Reference cycles are still collected; memory is not held longer than
the few thousand objects the threshold allows.
"""

from __future__ import annotations

import gc
from typing import Final

#: Container objects made (less those freed) between two collections of the youngest
#: generation: above what a few hundred requests in flight hold at once.
FIRST_GENERATION: Final = 10_000


def settle() -> None:
    """After start-up: collect, freeze what is left, raise the first threshold."""
    gc.collect()
    gc.freeze()
    _first, second, third = gc.get_threshold()
    gc.set_threshold(FIRST_GENERATION, second, third)
