"""How a program stops: the one signal handling of the long-running commands (`run`, `demo`,
`demo --fleet`, `fleet serve`).

Two programs keep a policy of their own on the platform's primitive
(`Platform.install_stop_handlers`): `simulate` also stops on SIGHUP (a closed terminal must not
leave a simulator behind) and `elect` never exits at once on a second signal (its command is
stopped and the leadership resigned first, in that order, however often it is asked).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from bridge.infra import platform

log = logging.getLogger("bridge")


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set `stop` on SIGINT/SIGTERM (Ctrl+C/Ctrl+Break on Windows), exit at once on the second.

    SIGHUP is logged and ignored rather than taken as a reload: swapping sinks, watchers or
    hooks under a running spool is where events get lost or doubled, and a restart (which
    delivers what is in flight and resumes from the checkpoints) applies a change safely.
    """
    requests: list[str] = []

    def requested(name: str) -> None:
        requests.append(name)
        if len(requests) > 1:
            log.warning("received %s again: exiting at once", name)
            os._exit(128 + signal.Signals[name] if name in signal.Signals.__members__ else 1)
        log.info("received %s: shutting down (send it again to exit at once)", name)
        stop.set()

    def hangup() -> None:
        log.warning(
            "received SIGHUP: ignored; the configuration is read at start only, "
            "restart the bridge to apply a change"
        )

    platform.current().install_stop_handlers(asyncio.get_running_loop(), requested, hangup)
