"""`python -m tests.fleet.serve CONFIG`: a fleet service in a process of its own, until
SIGTERM, so end-to-end tests can kill -9 it mid-stream and start it again.

The same as `maintenance-bridge fleet --config CONFIG` without the command line around it
(the tests do not depend on the CLI's options).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

from bridge.fleet.config import load_fleet_config
from bridge.fleet.service import FleetService


async def serve(config_path: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await FleetService(load_fleet_config(config_path)).run(stop)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(Path(sys.argv[1])))
