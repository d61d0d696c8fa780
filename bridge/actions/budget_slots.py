"""The actions' side of the maintenance budget (`[coordination]`,
bridge/actions/coordination): a disruptive action takes a slot for its notice before it
runs, the notice's end gives the slot back, a lease that could not be renewed is reported,
and a start-up takes again the slots of actions that ran before a restart.

Each of these is an audit event about the notice (`budget.released`, `budget.unrenewed`),
committed with `bridge.actions.record`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bridge import contract
from bridge.actions import audit
from bridge.actions.chains import Chains
from bridge.actions.planned import Planned, chain_of
from bridge.actions.record import Recorder
from bridge.pipeline.spool import Action
from bridge.pipeline.typed_events import maintenance

if TYPE_CHECKING:
    from bridge.actions.coordination.budget import Budget, Grant, Unrenewed

log = logging.getLogger("bridge.actions")


class BudgetSlots:
    """Takes, gives back and resumes the budget slots of the notices (module docstring)."""

    def __init__(
        self, budget: Budget, record: Recorder, chains: Chains, clock: Callable[[], datetime]
    ) -> None:
        self.budget = budget
        self._record = record
        self._chains = chains
        self._clock = clock
        #: The maintenance event each notice took its slot for (the audit events' trigger).
        self._triggers: dict[str, audit.Trigger] = {}
        self._ended: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        budget.on_unrenewed = self._unrenewed

    def in_force(self, event: contract.Event) -> Callable[[], bool]:
        """Whether a slot is still wanted for `event`'s notice: it has not ended, and the
        actions are not stopping."""
        chain = chain_of(event)
        return lambda: chain not in self._ended and not self._chains.stopping

    async def take(
        self,
        event: contract.Event,
        action: str,
        deadline: datetime | None,
        wanted: Callable[[], bool],
    ) -> Grant:
        """A slot for `event`'s notice (or why not: timed out, withdrawn)."""
        self._triggers.setdefault(chain_of(event), audit.Trigger.of(event))
        return await self.budget.take(
            chain_of(event),
            maintenance(event).instance,
            action=action,
            deadline=deadline,
            wanted=wanted,
        )

    def ended(self, event: contract.Event) -> None:
        """`event` completed or cancelled its notice: give its slot back, and say so."""
        chain = chain_of(event)
        self._ended.add(chain)
        self._triggers.pop(chain, None)
        released = self.budget.release(chain)
        if released is not None:
            audit_event = audit.budget_released(
                audit.Trigger.of(event), released.as_data(), self._clock()
            )
            self._chains.track(self._record.commit([audit_event], {}), "budget-released")

    def _unrenewed(self, slot: Unrenewed) -> None:
        """A held slot's lease was not renewed in time: one audit event per notice holding it."""
        for chain in sorted(slot.notices):
            trigger = self._triggers.get(chain)
            if trigger is not None:
                event = audit.budget_unrenewed(trigger, slot.as_data(), self._clock())
                self._chains.track(self._record.commit([event], {}), "budget-unrenewed")

    async def resume(self, rows: Sequence[tuple[Action, Planned]]) -> None:
        """Take again the slots of notices still in force whose disruptive action had
        started before the restart (the maintenance may be under way), and start the
        engine probe."""
        probe = asyncio.create_task(self.budget.probe(), name="coordination:probe")
        self._tasks.add(probe)
        in_force = set()
        for key, body in (await self._record.spool.in_force()).items():
            in_force.add("\t".join((contract.from_cloudevent(body).source, key.split("\t", 1)[1])))
        resumed: set[str] = set()
        for row, detail in rows:
            event = detail.event
            chain = chain_of(event)
            ran = row.state not in ("planned", "skipped", "held", "withdrawn", "rejected")
            if not detail.budget or not ran or chain in resumed or chain not in in_force:
                continue
            resumed.add(chain)
            log.info(
                "taking the budget slot of %s again (its action ran before the restart)",
                maintenance(event).notice_id,
            )
            task = asyncio.create_task(
                self.take(event, "resume", None, self.in_force(event)),
                name=f"coordination:resume:{chain}",
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Stop the probe and the resumptions, and close the budget."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.budget.aclose()
