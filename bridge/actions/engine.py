"""Acting on notices: hooks and Azure approvals, each at most once, surviving restarts.

The runner asks `plan` which actions a batch of new maintenance events calls for, commits
them (state `planned`, with the event) in the very transaction that commits the events, and
then hands them to `planned`. From there:

- A hook run is marked `running` (durably) before its process starts, and its outcome is
  written in the transaction that spools its `hook.completed` audit event. A run found
  `running` at start-up was cut short by a crash: it is reported as `interrupted`, never
  re-run, because "at most once" is what a drain or a shutdown script needs.
- An approval is marked `posting` before the POST and `approved` in the transaction that
  spools its `maintenance.approved` audit event. A crash between the POST and that commit
  leaves `posting`: the next start POSTs once more, which is harmless because IMDS answers
  200 to a repeated approval of a valid event (the vendor page says so). That is the only
  case of a second POST for one event; it is never sent twice otherwise.

Hooks of one notice run one after another, in configuration order and transition order
(a notice's chain); different notices run concurrently. `approve-after-hooks` joins the end
of its notice's chain and approves only if every hook that ran for that transition
succeeded. An approval is only sent while the notice is still Scheduled.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from bridge import contract
from bridge.actions import approval, audit, hooks
from bridge.actions.coordination.hooks import last_useful_start, refusal
from bridge.config import Config
from bridge.infra.backoff import retry_logger, retry_until_done
from bridge.infra.prometheus import PREFIX, Exposition
from bridge.pipeline.approver import ApprovalRejected
from bridge.pipeline.spool import Action, NewEvent, Spool, SpoolError
from bridge.pipeline.typed_events import maintenance
from bridge.providers import registry as providers

if TYPE_CHECKING:
    from bridge.actions.coordination.budget import Budget, Grant, Unrenewed

log = logging.getLogger("bridge.actions")

Approve = Callable[[str], Awaitable[None]]
Clock = Callable[[], datetime]
#: (source, notice id) -> whether that notice is in force and Scheduled right now.
IsScheduled = Callable[[str, str], bool]


def _now() -> datetime:
    return datetime.now(UTC)


def _hook_key(event: contract.Event, hook_name: str) -> str:
    data = maintenance(event)
    return "\t".join(("hook", event.source, data.notice_id, data.status, hook_name))


def _approval_key(event: contract.Event) -> str:
    return "\t".join(("approve", event.source, maintenance(event).notice_id))


def _chain(event: contract.Event) -> str:
    return "\t".join((event.source, maintenance(event).notice_id))


class _Stored(msgspec.Struct, frozen=True, kw_only=True):
    """A planned action as `plan` stores it in the spool's actions table (JSON, written with
    `json.dumps` in the key order `plan` gives; rows of earlier versions read the same)."""

    action: Literal["hook", "approve", "approve-after-hooks"]
    event: msgspec.Raw
    hook: str = ""  # action "hook": its name
    rule: str = ""  # approvals: the rule that decided
    hooks: list[str] = []  # approve-after-hooks: the keys of the hooks it waits for
    budget: bool = False  # the action takes a slot of the maintenance budget


@dataclass(frozen=True, slots=True)
class Planned:
    """A planned action, read back from the spool: its maintenance event decoded once."""

    action: Literal["hook", "approve", "approve-after-hooks"]
    event: contract.Event
    hook: str
    rule: str
    hooks: list[str]
    budget: bool

    @classmethod
    def decode(cls, detail: str | bytes) -> Planned:
        stored = msgspec.json.decode(detail, type=_Stored)
        return cls(
            action=stored.action,
            event=contract.from_cloudevent(bytes(stored.event)),
            hook=stored.hook,
            rule=stored.rule,
            hooks=stored.hooks,
            budget=stored.budget,
        )


def _readable(rows: Sequence[Action]) -> list[tuple[Action, Planned]]:
    """The rows whose detail reads back. One that does not (it cannot: this code wrote it) is
    logged and left as it is, rather than stop every start-up of the bridge."""
    found = []
    for row in rows:
        try:
            found.append((row, Planned.decode(row.detail)))
        except (contract.ContractError, msgspec.DecodeError) as exc:
            key = row.key.replace("\t", " ")
            log.error("planned action %s is unreadable, left as it is: %s", key, exc)
    return found


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
        self._approve = approve
        self._is_scheduled = is_scheduled
        self._clock = clock
        self._retry_delay = retry_delay
        self._hooks = {hook.display_name(): hook for hook in config.hooks}
        #: For the metrics: hook runs by (hook, outcome), approval decisions by (rule, result).
        self.hook_runs: Counter[tuple[str, str]] = Counter()
        self.approvals: Counter[tuple[str, str]] = Counter()
        self._known: set[str] = set()
        self._chains: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._approvals: set[asyncio.Task[None]] = set()
        self._stopping = False
        #: What a hook cut short gets between SIGTERM and SIGKILL (less when stopping).
        self._kill_grace = hooks.KILL_GRACE
        #: The fleet's maintenance budget, when [coordination] is configured.
        self.budget: Budget | None = None
        if config.coordination is not None:
            from bridge.actions.coordination.budget import build

            self.budget = build(config.coordination)
            self.budget.on_unrenewed = self._budget_unrenewed
        #: The maintenance event each notice took its slot for (the audit events' trigger).
        self._triggers: dict[str, audit.Trigger] = {}
        self._ended: set[str] = set()
        self._budget_tasks: set[asyncio.Task[Any]] = set()

    @property
    def enabled(self) -> bool:
        return bool(self._hooks) or (
            self._config.approval.leader != "none" and bool(approval.rules(self._config.approval))
        )

    # -- planning ---------------------------------------------------------------------------

    def plan(self, events: Sequence[contract.Event]) -> dict[str, str]:
        """The new actions the maintenance `events` call for: key -> detail (the JSON
        `Planned.decode` reads back), in the order they run."""
        planned: dict[str, str] = {}
        for event in events:
            data = maintenance(event)
            names = [n for n, hook in self._hooks.items() if hooks.matches(hook, data)]
            decision = self._approval_for(data)
            if not names and decision is None:
                continue
            hook_keys = [_hook_key(event, name) for name in names]
            seen = contract.to_dict(event)  # stored as consumers saw it (a hook's stdin, resumed)
            for key, name in zip(hook_keys, names, strict=True):
                if key not in self._known:
                    detail: dict[str, object] = {"action": "hook", "hook": name, "event": seen}
                    if self._hooks[name].budget:
                        detail["budget"] = True
                    planned[key] = json.dumps(detail)
            key = _approval_key(event)
            if decision is not None and key not in self._known and key not in planned:
                planned[key] = json.dumps(
                    {
                        "action": decision.action,
                        "rule": decision.rule,
                        "hooks": hook_keys,
                        "event": seen,
                        **({"budget": True} if self.budget is not None else {}),
                    }
                )
        return planned

    def _approval_for(self, data: contract.MaintenanceData) -> approval.Decision | None:
        config = self._config.approval
        if not providers.get(data.provider).approves_events or data.status != "scheduled":
            return None
        if not isinstance(data.raw, dict):
            return None  # the vendor's object as received: an Azure event is a JSON object
        decision = approval.decide(config, data.raw)
        if decision is None or decision.action == "never":
            return None
        if not approval.is_leader(config, data.instance.name, data.affected):
            log.info(
                "not approving %s: %s (leader = %s) approves for the group",
                data.notice_id,
                min(data.affected, key=str.casefold),
                config.leader,
            )
            return None
        return decision

    def planned(self, plan: dict[str, str]) -> None:
        """`plan` was committed: start its actions."""
        for key, detail in plan.items():
            self._known.add(key)
            self._schedule(key, Planned.decode(detail), resumed=False)

    def observed(self, events: Sequence[contract.Event]) -> None:
        """`events` were committed: a notice that completed or was cancelled frees its slot."""
        for event in events:
            if maintenance(event).status in ("completed", "cancelled"):
                chain = _chain(event)
                self._ended.add(chain)
                self._triggers.pop(chain, None)
                released = self.budget.release(chain) if self.budget is not None else None
                if released is not None:
                    audit_event = audit.budget_released(
                        audit.Trigger.of(event), released.as_data(), self._clock()
                    )
                    self._track(self._commit([audit_event], {}), "budget-released")

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Report runs a crash interrupted; resume what was planned and not done."""
        rows = await self._spool.actions()
        self._known = {row.key for row in rows}
        await self._report_interrupted()
        readable = _readable(rows)
        if self.budget is not None:
            await self._resume_budget(readable)
        for row, detail in readable:
            if row.state in ("planned", "posting"):
                self._schedule(row.key, detail, resumed=row.state == "posting")

    async def stop(self, timeout: float) -> None:
        """Let running hooks finish within `timeout`; what has not started stays planned.

        A hook still running near the deadline has its process tree terminated, then killed
        at the deadline (a quarter of `timeout`, at most `hooks.KILL_GRACE`, is left for that),
        so a stop never waits for a hook's own timeout nor past `timeout`.
        """
        self._stopping = True
        for task in self._approvals:
            task.cancel()
        pending = set(self._tasks)
        if pending:
            self._kill_grace = min(hooks.KILL_GRACE, timeout / 4)
            _, late = await asyncio.wait(pending, timeout=timeout - self._kill_grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if late:
                log.warning("shutdown deadline reached; %d hook chain(s) cut short", len(late))
        await self._report_interrupted()
        if self.budget is not None:
            for task in self._budget_tasks:
                task.cancel()
            await asyncio.gather(*self._budget_tasks, return_exceptions=True)
            await self.budget.aclose()

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
            self._chained(event, self._run_hook(key, detail.hook, event))
        elif detail.action == "approve-after-hooks" and not resumed:
            self._chained(event, self._approve_after_hooks(key, detail))
        else:
            task = self._track(self._send_approval(key, detail, resumed=resumed), key)
            self._approvals.add(task)
            task.add_done_callback(self._approvals.discard)

    def _track(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=f"action:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _chained(self, event: contract.Event, work: Coroutine[Any, Any, None]) -> None:
        chain = _chain(event)
        previous = self._chains.get(chain)

        async def after_previous() -> None:
            try:
                if previous is not None:
                    await asyncio.gather(previous, return_exceptions=True)
            except asyncio.CancelledError:
                work.close()
                raise
            if self._stopping:
                work.close()  # not started: stays planned for the next start
                return
            await work

        task = self._track(after_previous(), chain)
        self._chains[chain] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._chains.get(chain) is done:
                del self._chains[chain]

        task.add_done_callback(forget)

    async def _commit(self, events: Sequence[contract.Event], states: dict[str, str]) -> None:
        """Spool audit events and action states together, retrying a failing disk."""
        rows = [NewEvent(e.id, e.source, e.type, contract.encode(e)) for e in events]
        await retry_until_done(
            lambda: self._spool.commit(rows, states=states),
            retry_on=SpoolError,
            initial=self._retry_delay,
            maximum=30.0,
            before_sleep=retry_logger(log, "cannot record action state"),
        )

    async def _run_hook(self, key: str, name: str, event: contract.Event) -> None:
        trigger = audit.Trigger.of(event)
        hook = self._hooks.get(name)
        grant: Grant | None = None
        if hook is None:
            error = "the hook is no longer configured"
            log.warning("hook %s not run for %s: %s", name, event.id, error)
            outcome = audit.HookOutcome(name, "skipped", None, 0.0, "", error)
        else:
            if hook.budget and self.budget is not None:
                due = last_useful_start(hook, maintenance(event))
                grant = await self._take(event, f"hook {name}", due, self._in_force(event))
                if grant.outcome == "withdrawn" and self._stopping:
                    return  # not started: stays planned for the next start
            refused = None if grant is None else refusal(grant, hook.on_budget_timeout)
            if grant is not None and refused is not None:
                log.warning("hook %s skipped for %s: %s", name, event.id, refused)
                outcome = audit.HookOutcome(
                    name, "skipped", None, grant.waited_seconds, "", refused
                )
            else:
                await self._commit([], {key: "running"})
                outcome = await hooks.run(
                    hook, event, hooks.stdin_body(event), self._clock(), lambda: self._kill_grace
                )
        completed = audit.hook_completed(
            trigger, outcome, self._clock(), budget=None if grant is None else grant.as_data()
        )
        await self._commit([completed], {key: outcome.outcome})
        self.hook_runs[(name, outcome.outcome)] += 1

    async def _report_interrupted(self) -> None:
        for row, detail in _readable(await self._spool.actions(["running"])):
            name, event = detail.hook, detail.event
            error = "the bridge stopped while it ran (it may not have started); not re-run"
            log.warning("hook %s for %s was interrupted: %s", name, event.id, error)
            outcome = audit.HookOutcome(name, "interrupted", None, 0.0, "", error)
            completed = audit.hook_completed(audit.Trigger.of(event), outcome, self._clock())
            await self._commit([completed], {row.key: "interrupted"})
            self.hook_runs[(name, "interrupted")] += 1

    async def _approve_after_hooks(self, key: str, detail: Planned) -> None:
        states = {k: await self._spool.action_state(k) for k in detail.hooks}
        failed = {k.rsplit("\t", 1)[1]: s for k, s in states.items() if s != "succeeded"}
        if failed:
            log.warning(
                "not approving %s (%s): hook(s) did not succeed: %s",
                maintenance(detail.event).notice_id,
                detail.rule,
                ", ".join(f"{name} {state}" for name, state in failed.items()),
            )
            await self._commit([], {key: "held"})
            self.approvals[(detail.rule, "held")] += 1
            return
        await self._send_approval(key, detail, resumed=False)

    async def _send_approval(self, key: str, detail: Planned, *, resumed: bool) -> None:
        event = detail.event
        data = maintenance(event)
        notice_id = data.notice_id
        source = event.source
        grant: Grant | None = None
        if self.budget is not None:
            grant = await self._take(
                event, "approval", None, lambda: self._is_scheduled(source, notice_id)
            )
            if grant.outcome == "withdrawn":
                log.warning(
                    "not approving %s: it started at NotBefore without our approval while "
                    "the approval waited %.0fs for a budget slot of %s; the maintenance "
                    "proceeds without us",
                    notice_id,
                    grant.waited_seconds,
                    grant.group,
                )

        async def attempt() -> bool:
            """One try: True once approved, False when it is over without an approval."""
            if not self._is_scheduled(source, notice_id):
                log.info("not approving %s: it is no longer Scheduled", notice_id)
                await self._commit([], {key: "withdrawn"})
                self.approvals[(detail.rule, "withdrawn")] += 1
                return False
            await self._commit([], {key: "posting"})
            if resumed:
                log.info("approving %s again: the last run stopped during its POST", notice_id)
            try:
                await self._approve(notice_id)
            except ApprovalRejected as exc:
                log.warning("approval of %s refused: %s", notice_id, exc)
                await self._commit([], {key: "rejected"})
                self.approvals[(detail.rule, "rejected")] += 1
                return False
            return True

        approved_now = await retry_until_done(
            attempt,
            retry_on=Exception,
            initial=self._retry_delay,
            maximum=30.0,
            before_sleep=retry_logger(
                log, f"cannot approve {notice_id} yet", level=logging.WARNING
            ),
        )
        if not approved_now:
            return
        leader = self._config.approval.leader
        assert leader != "none"  # is_leader refuses every notice then: nothing is planned
        log.info("approved %s (%s, leader = %s)", notice_id, detail.rule, leader)
        approved = audit.approved(
            audit.Trigger.of(event),
            approved_by=data.instance.name,
            rule=detail.rule,
            leader=leader,
            at=self._clock(),
            budget=None if grant is None else grant.as_data(),
        )
        await self._commit([approved], {key: "approved"})
        self.approvals[(detail.rule, "approved")] += 1

    # -- the budget (bridge/actions/coordination) -----------------------------------------------

    def _in_force(self, event: contract.Event) -> Callable[[], bool]:
        chain = _chain(event)
        return lambda: chain not in self._ended and not self._stopping

    async def _take(
        self,
        event: contract.Event,
        action: str,
        deadline: datetime | None,
        wanted: Callable[[], bool],
    ) -> Grant:
        assert self.budget is not None
        self._triggers.setdefault(_chain(event), audit.Trigger.of(event))
        return await self.budget.take(
            _chain(event),
            maintenance(event).instance,
            action=action,
            deadline=deadline,
            wanted=wanted,
        )

    def _budget_unrenewed(self, slot: Unrenewed) -> None:
        """A held slot's lease was not renewed in time: one audit event per notice holding it."""
        for chain in sorted(slot.notices):
            trigger = self._triggers.get(chain)
            if trigger is not None:
                event = audit.budget_unrenewed(trigger, slot.as_data(), self._clock())
                self._track(self._commit([event], {}), "budget-unrenewed")

    async def _resume_budget(self, rows: Sequence[tuple[Action, Planned]]) -> None:
        """Take again the slots of notices still in force whose disruptive action had
        started before the restart (the maintenance may be under way), and start the
        engine probe."""
        assert self.budget is not None
        probe = asyncio.create_task(self.budget.probe(), name="coordination:probe")
        self._budget_tasks.add(probe)
        in_force = set()
        for key, body in (await self._spool.in_force()).items():
            in_force.add("\t".join((contract.from_cloudevent(body).source, key.split("\t", 1)[1])))
        resumed: set[str] = set()
        for row, detail in rows:
            event = detail.event
            chain = _chain(event)
            ran = row.state not in ("planned", "skipped", "held", "withdrawn", "rejected")
            if not detail.budget or not ran or chain in resumed or chain not in in_force:
                continue
            resumed.add(chain)
            log.info(
                "taking the budget slot of %s again (its action ran before the restart)",
                maintenance(event).notice_id,
            )
            task = asyncio.create_task(
                self._take(event, "resume", None, self._in_force(event)),
                name=f"coordination:resume:{chain}",
            )
            self._budget_tasks.add(task)
            task.add_done_callback(self._budget_tasks.discard)
