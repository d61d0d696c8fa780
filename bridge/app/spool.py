"""`spool list|replay|purge`: the spool's queues and dead letters, beside a running bridge."""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from bridge.app.exits import EXIT_FAILURE, EXIT_OK
from bridge.config import Config
from bridge.pipeline.spool import Spool


async def main(args: argparse.Namespace, config: Config) -> int:
    spool = Spool(config.state.dir, config.sink_names())
    if not spool.path.exists():
        print(f"no spool at {spool.path}", file=sys.stderr)
        return EXIT_FAILURE
    await spool.open()
    try:
        if args.spool_command == "list":
            depth = await spool.depth()
            print(f"spool: {spool.path}")
            for sink, (count, oldest) in sorted(depth.items()):
                if args.sink and sink != args.sink:
                    continue
                age = (
                    f", oldest {dt.datetime.fromtimestamp(oldest, dt.UTC):%Y-%m-%d %H:%M:%S}Z"
                    if oldest
                    else ""
                )
                print(f"pending  {sink}: {count} event(s){age}")
            letters = await spool.dead_letters(args.sink)
            print(f"dead letters: {len(letters)}")
            for d in letters:
                when = dt.datetime.fromtimestamp(d.at, dt.UTC)
                print(
                    f"  seq={d.seq} sink={d.sink} id={d.id} type={d.type} attempts={d.attempts} "
                    f"at={when:%Y-%m-%d %H:%M:%S}Z reason={d.reason}"
                )
        elif args.spool_command == "replay":
            count = await spool.replay(args.sink, args.seq)
            print(
                f"replayed {count} event(s); a running bridge sends them within seconds, a "
                "stopped one when it starts"
            )
        else:
            count = await spool.purge(args.sink, args.seq)
            print(f"purged {count} dead-lettered event(s)")
    finally:
        await spool.close()
    return EXIT_OK
