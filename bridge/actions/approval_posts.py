"""Sending a planned approval (Azure's StartRequests) at most once, while the notice is
still Scheduled.

An approval is marked `posting` before the POST and `approved` in the transaction that spools
its `maintenance.approved` audit event. A crash between the POST and that commit leaves
`posting`: the next start POSTs once more, which is harmless because IMDS answers 200 to a
repeated approval of a valid event (the vendor page says so). That is the only case of a
second POST for one event; it is never sent twice otherwise. `approve-after-hooks` approves
only if every hook that ran for its transition succeeded. With `[coordination]`, the
approval first takes a slot of the maintenance budget.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING

from bridge.actions import audit
from bridge.actions.budget_slots import BudgetSlots
from bridge.actions.planned import Planned
from bridge.actions.record import Recorder
from bridge.config import Approval
from bridge.infra.backoff import retry_logger, retry_until_done
from bridge.pipeline.approver import ApprovalRejected
from bridge.pipeline.typed_events import maintenance

if TYPE_CHECKING:
    from bridge.actions.coordination.budget import Grant

log = logging.getLogger("bridge.actions")

#: Sends the approval of a notice id (the provider's approver).
Approve = Callable[[str], Awaitable[None]]
#: (source, notice id) -> whether that notice is in force and Scheduled right now.
IsScheduled = Callable[[str, str], bool]


class ApprovalPosts:
    """Sends approvals and records how each ended (see the module docstring)."""

    def __init__(
        self,
        approve: Approve,
        is_scheduled: IsScheduled,
        policy: Approval,
        record: Recorder,
        slots: BudgetSlots | None,
        clock: Callable[[], datetime],
        retry_delay: float,
    ) -> None:
        self._approve = approve
        self._is_scheduled = is_scheduled
        self._policy = policy
        self._record = record
        self._slots = slots
        self._clock = clock
        self._retry_delay = retry_delay
        #: For the metrics: decisions by (rule, result).
        self.counts: Counter[tuple[str, str]] = Counter()

    async def after_hooks(self, key: str, detail: Planned) -> None:
        """`approve-after-hooks`: approve if every hook of the transition succeeded, else
        hold the approval."""
        states = {k: await self._record.spool.action_state(k) for k in detail.hooks}
        failed = {k.rsplit("\t", 1)[1]: s for k, s in states.items() if s != "succeeded"}
        if failed:
            log.warning(
                "not approving %s (%s): hook(s) did not succeed: %s",
                maintenance(detail.event).notice_id,
                detail.rule,
                ", ".join(f"{name} {state}" for name, state in failed.items()),
            )
            await self._record.commit([], {key: "held"})
            self.counts[(detail.rule, "held")] += 1
            return
        await self.send(key, detail, resumed=False)

    async def send(self, key: str, detail: Planned, *, resumed: bool) -> None:
        """Approve `detail`'s notice (`resumed`: a POST of the last run may have gone out)."""
        event = detail.event
        data = maintenance(event)
        notice_id = data.notice_id
        source = event.source
        grant: Grant | None = None
        if self._slots is not None:
            grant = await self._slots.take(
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
                await self._record.commit([], {key: "withdrawn"})
                self.counts[(detail.rule, "withdrawn")] += 1
                return False
            await self._record.commit([], {key: "posting"})
            if resumed:
                log.info("approving %s again: the last run stopped during its POST", notice_id)
            try:
                await self._approve(notice_id)
            except ApprovalRejected as exc:
                log.warning("approval of %s refused: %s", notice_id, exc)
                await self._record.commit([], {key: "rejected"})
                self.counts[(detail.rule, "rejected")] += 1
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
        leader = self._policy.leader
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
        await self._record.commit([approved], {key: "approved"})
        self.counts[(detail.rule, "approved")] += 1
