"""`python -m bench.fleet_reader URL PATH...`: GETs of the fleet API while something else runs.

The burst figure of `bench.fleet_scale` asks the API during a burst of posts. Asked from the
process that sends the burst, the answers would wait for that process's busy event loop
too; from this process they wait only for the fleet service. It GETs each path in turn
(with the bearer token of `FLEET_BENCH_TOKEN`) until its stdin is closed, then prints the
latencies (ms) as one JSON list.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import aiohttp


async def read(url: str, paths: list[str]) -> list[float]:
    samples: list[float] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.read(1) else None)
    headers = {"Authorization": f"Bearer {os.environ['FLEET_BENCH_TOKEN']}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        while not stop.is_set():
            for path in paths:
                began = time.perf_counter()
                async with http.get(url + path) as answer:
                    await answer.read()
                samples.append((time.perf_counter() - began) * 1000)
    return samples


def main(argv: list[str] | None = None) -> int:
    url, *paths = argv if argv is not None else sys.argv[1:]
    print(json.dumps(asyncio.run(read(url, paths))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
