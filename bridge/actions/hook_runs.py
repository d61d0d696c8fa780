"""Running a planned hook at most once, and reporting the runs a crash cut short.

A run is marked `running` (durably) before its process starts, and its outcome is written in
the transaction that spools its `hook.completed` audit event. A run found `running` at
start-up was cut short by a crash: it is reported as `interrupted`, never re-run, because
"at most once" is what a drain or a shutdown script needs. A hook marked `budget = true`
first takes a slot of the maintenance budget (`bridge.actions.budget_slots`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from bridge import contract
from bridge.actions import audit, hooks
from bridge.actions.budget_slots import BudgetSlots
from bridge.actions.chains import Chains
from bridge.actions.coordination.hooks import last_useful_start, refusal
from bridge.actions.planned import readable
from bridge.actions.record import Recorder
from bridge.config import Hook
from bridge.pipeline.typed_events import maintenance

if TYPE_CHECKING:
    from bridge.actions.coordination.budget import Grant

log = logging.getLogger("bridge.actions")


class HookRuns:
    """Runs the configured hooks (by display name) and records how each run ended."""

    def __init__(
        self,
        configured: Mapping[str, Hook],
        record: Recorder,
        chains: Chains,
        slots: BudgetSlots | None,
        clock: Callable[[], datetime],
    ) -> None:
        self._hooks = configured
        self._record = record
        self._chains = chains
        self._slots = slots
        self._clock = clock
        #: For the metrics: runs by (hook, outcome).
        self.counts: Counter[tuple[str, str]] = Counter()
        #: What a hook cut short gets between SIGTERM and SIGKILL (less when stopping).
        self.kill_grace = hooks.KILL_GRACE

    async def run(self, key: str, name: str, event: contract.Event) -> None:
        """Run hook `name` for `event` (planned under `key`), once."""
        trigger = audit.Trigger.of(event)
        hook = self._hooks.get(name)
        grant: Grant | None = None
        if hook is None:
            error = "the hook is no longer configured"
            log.warning("hook %s not run for %s: %s", name, event.id, error)
            outcome = audit.HookOutcome(name, "skipped", None, 0.0, "", error)
        else:
            if hook.budget and self._slots is not None:
                due = last_useful_start(hook, maintenance(event))
                grant = await self._slots.take(
                    event, f"hook {name}", due, self._slots.in_force(event)
                )
                if grant.outcome == "withdrawn" and self._chains.stopping:
                    return  # not started: stays planned for the next start
            refused = None if grant is None else refusal(grant, hook.on_budget_timeout)
            if grant is not None and refused is not None:
                log.warning("hook %s skipped for %s: %s", name, event.id, refused)
                outcome = audit.HookOutcome(
                    name, "skipped", None, grant.waited_seconds, "", refused
                )
            else:
                await self._record.commit([], {key: "running"})
                outcome = await hooks.run(
                    hook, event, hooks.stdin_body(event), self._clock(), lambda: self.kill_grace
                )
        completed = audit.hook_completed(
            trigger, outcome, self._clock(), budget=None if grant is None else grant.as_data()
        )
        await self._record.commit([completed], {key: outcome.outcome})
        self.counts[(name, outcome.outcome)] += 1

    async def report_interrupted(self) -> None:
        """Report every run still marked `running`: a stop or a crash cut it short."""
        for row, detail in readable(await self._record.spool.actions(["running"])):
            name, event = detail.hook, detail.event
            error = "the bridge stopped while it ran (it may not have started); not re-run"
            log.warning("hook %s for %s was interrupted: %s", name, event.id, error)
            outcome = audit.HookOutcome(name, "interrupted", None, 0.0, "", error)
            completed = audit.hook_completed(audit.Trigger.of(event), outcome, self._clock())
            await self._record.commit([completed], {row.key: "interrupted"})
            self.counts[(name, "interrupted")] += 1
