"""Acting on notices: hooks and Azure approvals, each at most once, surviving restarts.

The runner asks `plan` which actions a batch of new maintenance events calls for
(`bridge.actions.planning`), commits them (state `planned`, with the event, in the form of
`bridge.actions.planned`) in the very transaction that commits the events, and then hands
them to `planned`. From there `Actions` runs each in its notice's chain
(`bridge.actions.chains`): a hook by `bridge.actions.hook_runs` (marked `running` before its
process starts; found `running` at start-up, it is reported `interrupted`, never re-run), an
approval by `bridge.actions.approval_posts` (marked `posting` before the POST; only a crash
between the POST and its commit sends a second one, which IMDS accepts). With
`[coordination]`, both take a slot of the maintenance budget first
(`bridge.actions.budget_slots`). What they write goes through `bridge.actions.record`.

Hooks of one notice run one after another, in configuration order and transition order
(a notice's chain); different notices run concurrently. `approve-after-hooks` joins the end
of its notice's chain and approves only if every hook that ran for that transition
succeeded. An approval is only sent while the notice is still Scheduled.

This module holds the part that ties them together: the life cycle (start, resume, stop),
which planned action goes where, and the figures for `/metrics`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from bridge import contract
from bridge.actions import approval, hooks, planning
from bridge.actions.approval_posts import ApprovalPosts, Approve, IsScheduled
from bridge.actions.budget_slots import BudgetSlots
from bridge.actions.chains import Chains
from bridge.actions.hook_runs import HookRuns
from bridge.actions.planned import Planned, chain_of, readable
from bridge.actions.record import Recorder
from bridge.config import Config
from bridge.infra.prometheus import PREFIX, Exposition
from bridge.pipeline.spool import Spool
from bridge.pipeline.typed_events import maintenance

if TYPE_CHECKING:
    from bridge.actions.coordination.budget import Budget

log = logging.getLogger("bridge.actions")

Clock = Callable[[], datetime]

__all__ = ["Actions", "Approve", "Clock", "IsScheduled"]


def _now() -> datetime:
    return datetime.now(UTC)


class Actions:
    """Plans, runs and records hooks and approvals (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        spool: Spool,
        approve: Approve,
        is_scheduled: IsScheduled,
        *,
        clock: Clock = _now,
        retry_delay: float = 0.5,
    ) -> None:
        self._config = config
        self._spool = spool
        self._hooks = {hook.display_name(): hook for hook in config.hooks}
        self._known: set[str] = set()
        self._chains = Chains()
        self._approvals: set[asyncio.Task[None]] = set()
        record = Recorder(spool, retry_delay)
        #: The fleet's maintenance budget, when [coordination] is configured.
        self.budget: Budget | None = None
        self._slots: BudgetSlots | None = None
        if config.coordination is not None:
            from bridge.actions.coordination.budget import build

            self.budget = build(config.coordination)
            self._slots = BudgetSlots(self.budget, record, self._chains, clock)
        self._hook_runs = HookRuns(self._hooks, record, self._chains, self._slots, clock)
        self._posts = ApprovalPosts(
            approve, is_scheduled, config.approval, record, self._slots, clock, retry_delay
        )

    @property
    def enabled(self) -> bool:
        return bool(self._hooks) or (
            self._config.approval.leader != "none" and bool(approval.rules(self._config.approval))
        )

    @property
    def hook_runs(self) -> Counter[tuple[str, str]]:
        """For the metrics: hook runs by (hook, outcome)."""
        return self._hook_runs.counts

    @property
    def approvals(self) -> Counter[tuple[str, str]]:
        """For the metrics: approval decisions by (rule, result)."""
        return self._posts.counts

    # -- planning ---------------------------------------------------------------------------

    def plan(self, events: Sequence[contract.Event]) -> dict[str, str]:
        """The new actions the maintenance `events` call for: key -> detail (the JSON
        `Planned.decode` reads back), in the order they run."""
        return planning.plan(
            events,
            self._hooks,
            self._config.approval,
            self._known,
            budgeted=self.budget is not None,
        )

    def planned(self, plan: dict[str, str]) -> None:
        """`plan` was committed: start its actions."""
        for key, detail in plan.items():
            self._known.add(key)
            self._schedule(key, Planned.decode(detail), resumed=False)

    def observed(self, events: Sequence[contract.Event]) -> None:
        """`events` were committed: a notice that completed or was cancelled frees its slot."""
        if self._slots is None:
            return
        for event in events:
            if maintenance(event).status in ("completed", "cancelled"):
                self._slots.ended(event)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Report runs a crash interrupted; resume what was planned and not done."""
        rows = await self._spool.actions()
        self._known = {row.key for row in rows}
        await self._hook_runs.report_interrupted()
        found = readable(rows)
        if self._slots is not None:
            await self._slots.resume(found)
        for row, detail in found:
            if row.state in ("planned", "posting"):
                self._schedule(row.key, detail, resumed=row.state == "posting")

    async def stop(self, timeout: float) -> None:
        """Let running hooks finish within `timeout`; what has not started stays planned.

        A hook still running near the deadline has its process tree terminated, then killed
        at the deadline (a quarter of `timeout`, at most `hooks.KILL_GRACE`, is left for that),
        so a stop never waits for a hook's own timeout nor past `timeout`.
        """
        self._chains.stopping = True
        for task in self._approvals:
            task.cancel()
        pending = set(self._chains.tasks)
        if pending:
            self._hook_runs.kill_grace = min(hooks.KILL_GRACE, timeout / 4)
            _, late = await asyncio.wait(pending, timeout=timeout - self._hook_runs.kill_grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if late:
                log.warning("shutdown deadline reached; %d hook chain(s) cut short", len(late))
        await self._hook_runs.report_interrupted()
        if self._slots is not None:
            await self._slots.aclose()

    def export(self, out: Exposition) -> None:
        """Hook runs, approval decisions and the budget's figures for `/metrics`."""
        out.add(
            PREFIX + "hook_runs_total",
            "counter",
            "Hook runs by hook and outcome (succeeded, failed, timed-out, skipped, interrupted).",
            [
                ({"hook": hook, "outcome": outcome}, n)
                for (hook, outcome), n in sorted(self.hook_runs.items())
            ],
        )
        out.add(
            PREFIX + "approvals_total",
            "counter",
            "Azure approval decisions by rule and result (approved, rejected, held, withdrawn).",
            [
                ({"rule": rule, "result": result}, n)
                for (rule, result), n in sorted(self.approvals.items())
            ],
        )
        if self.budget is not None:
            self.budget.export(out)

    async def approved_ids(self) -> set[str]:
        """Notice ids whose approval was sent (or was being sent when a run stopped)."""
        rows = await self._spool.actions(("posting", "approved"))
        return {row.key.split("\t")[2] for row in rows if row.key.startswith("approve\t")}

    # -- running ----------------------------------------------------------------------------

    def _schedule(self, key: str, detail: Planned, *, resumed: bool) -> None:
        event = detail.event
        if detail.action == "hook":
            self._chains.chained(chain_of(event), self._hook_runs.run(key, detail.hook, event))
        elif detail.action == "approve-after-hooks" and not resumed:
            self._chains.chained(chain_of(event), self._posts.after_hooks(key, detail))
        else:
            task = self._chains.track(self._posts.send(key, detail, resumed=resumed), key)
            self._approvals.add(task)
            task.add_done_callback(self._approvals.discard)
