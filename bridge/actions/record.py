"""What the actions write: their audit events and their states, committed to the spool
together, so an action's outcome and the event that reports it are never apart. A failing
disk is retried (`bridge.infra.backoff`) rather than lose either."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from bridge import contract
from bridge.infra.backoff import retry_logger, retry_until_done
from bridge.pipeline.spool import NewEvent, Spool, SpoolError

log = logging.getLogger("bridge.actions")


class Recorder:
    """Commits audit events and action states to `spool` (see the module docstring)."""

    def __init__(self, spool: Spool, retry_delay: float) -> None:
        self.spool = spool
        self._retry_delay = retry_delay

    async def commit(self, events: Sequence[contract.Event], states: dict[str, str]) -> None:
        """Spool audit events and action states together, retrying a failing disk."""
        rows = [NewEvent(e.id, e.source, e.type, contract.encode(e)) for e in events]
        await retry_until_done(
            lambda: self.spool.commit(rows, states=states),
            retry_on=SpoolError,
            initial=self._retry_delay,
            maximum=30.0,
            before_sleep=retry_logger(log, "cannot record action state"),
        )
