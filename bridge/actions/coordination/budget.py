"""The maintenance budget as the actions engine sees it: take a slot, wait, time out, release.

A *disruptive action* (an early Azure approval, a hook marked `budget = true`) takes a slot
of its group before it runs. The slot belongs to the notice (its source and id): the hooks
and the approval of one notice share it, and it is held, renewed, while the action and the
maintenance run, until the notice completes or is cancelled. A VM counts once however many
of its notices hold the slot.

No slot free: the action waits, polling every `poll_interval`, until a slot frees, its
deadline passes (`timed-out`: the caller applies `on_budget_timeout`) or it is no longer
wanted (`withdrawn`: the notice ended or started without us). The engine unreachable:
`on_unavailable = "proceed"` acts without a slot (`unavailable`), `"wait"` keeps trying
within the same deadline. Every case is logged, counted for `/metrics` and visible in
`/readyz`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

from bridge import contract
from bridge.actions.coordination.backend import Backend, EngineError, Unavailable
from bridge.actions.coordination.settings import Coordination
from bridge.infra.backoff import retry_logger, retry_until_done
from bridge.infra.prometheus import PREFIX, Exposition

log = logging.getLogger("bridge.coordination")

Outcome = Literal["acquired", "timed-out", "unavailable", "withdrawn"]
Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


class Placement(Protocol):
    """Where a VM is: `contract.InstanceData` (an event's `data.instance`) or
    `bridge.pipeline.model.Instance` (the identity `doctor` found) both answer."""

    @property
    def zone(self) -> str | None: ...
    @property
    def location(self) -> str | None: ...
    @property
    def project(self) -> str | None: ...
    @property
    def subscription(self) -> str | None: ...
    @property
    def resource_group(self) -> str | None: ...
    @property
    def scale_set(self) -> str | None: ...


def group_of(settings: Coordination, instance: Placement | None) -> str:
    """The group a VM belongs to, from the `data.instance` of its events (None: unknown).

    `scale-set` is qualified by subscription and resource group (scale set names are only
    unique within a resource group); a VM outside any scale set falls back to its resource
    group. `zone` is the zone, else the region; with `zone_naming = "fleet"` an Azure zone is
    qualified by its region as the fleet names it (`contract.zone_of`: `eastus-2`, not `2`).
    Anything else is a literal group name.
    """

    def part(name: str) -> str:
        value: str | None = getattr(instance, name) if instance is not None else None
        return value or ""

    if settings.group == "scale-set":
        names = [part("subscription"), part("resource_group"), part("scale_set")]
        if not names[2]:
            names = [part("project"), part("resource_group") or part("zone")]
        return "scale-set:" + "/".join(n for n in names if n)
    if settings.group == "zone":
        zone, location = part("zone") or None, part("location") or None
        if settings.zone_naming == "fleet":
            return "zone:" + (contract.zone_of(zone, location) or "unknown")
        return "zone:" + (zone or location or "unknown")
    return settings.group


@dataclass(frozen=True, slots=True)
class Grant:
    """How taking a slot ended, as the audit events tell it."""

    outcome: Outcome
    group: str
    member: str
    waited_seconds: float
    acquired_at: datetime | None = None
    slot: str | None = None

    @property
    def may_act(self) -> bool:
        """The action may go ahead with respect to the budget (a slot, or `proceed`)."""
        return self.outcome in ("acquired", "unavailable")

    def as_data(self) -> contract.BudgetData:
        """The `budget` object of an audit event."""
        return contract.BudgetData(
            group=self.group,
            member=self.member,
            outcome=self.outcome,
            waited_seconds=round(self.waited_seconds, 3),
            acquired_at=None if self.acquired_at is None else self.acquired_at.astimezone(UTC),
            slot=self.slot,
        )


@dataclass(frozen=True, slots=True)
class Released:
    """A slot given back: who held it from when to when."""

    group: str
    member: str
    slot: str
    acquired_at: datetime
    released_at: datetime

    def as_data(self) -> contract.HeldSlotData:
        """The `budget` object of a `budget.released` audit event."""
        return contract.HeldSlotData(
            group=self.group,
            member=self.member,
            slot=self.slot,
            acquired_at=self.acquired_at.astimezone(UTC),
            released_at=self.released_at.astimezone(UTC),
            held_seconds=round((self.released_at - self.acquired_at).total_seconds(), 3),
        )


@dataclass(frozen=True, slots=True)
class Unrenewed:
    """A held slot whose lease was not renewed by the local deadline (`Timing`), and the
    notices holding it: what the log, the metric and the audit events report."""

    group: str
    member: str
    slot: str
    notices: frozenset[str]
    acquired_at: datetime
    unrenewed_at: datetime
    lease_ttl: float
    reason: str

    def as_data(self) -> contract.UnrenewedSlotData:
        """The `budget` object of a `budget.unrenewed` audit event."""
        return contract.UnrenewedSlotData(
            group=self.group,
            member=self.member,
            slot=self.slot,
            acquired_at=self.acquired_at.astimezone(UTC),
            unrenewed_at=self.unrenewed_at.astimezone(UTC),
            lease_ttl_seconds=self.lease_ttl,
            reason=self.reason,
        )


class Budget:
    """Slots held for notices, on top of a `Backend` (see the module docstring)."""

    def __init__(self, settings: Coordination, backend: Backend, *, clock: Clock = _now) -> None:
        self.settings = settings
        self.backend = backend
        self._clock = clock
        #: group -> (member, the notices holding the slot, when it was acquired, slot key)
        self._holds: dict[str, tuple[str, set[str], datetime, str]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._releases: set[asyncio.Task[None]] = set()
        #: For the metrics: takes by (action, outcome), takes that had to wait, their seconds.
        self.takes: Counter[tuple[str, str]] = Counter()
        self.waits: Counter[str] = Counter()
        self.wait_seconds: dict[str, float] = {}
        #: Failed calls to the engine (unreachable or refusing).
        self.unavailable = 0
        #: Disruptive actions waiting for a slot right now.
        self.waiting = 0
        #: The engine's last answer: (ok, detail, when), for /readyz.
        self.last_contact: tuple[bool, str, float] | None = None
        #: Held slots whose lease was not renewed by the local deadline, and who is told.
        self.unrenewed = 0
        self.on_unrenewed: Callable[[Unrenewed], None] = lambda _slot: None
        backend.on_unrenewed = self._unrenewed

    @property
    def held(self) -> int:
        return len(self._holds)

    def holds(self, notice: str) -> bool:
        return any(notice in notices for _, notices, _, _ in self._holds.values())

    def _contact(self, ok: bool, detail: str) -> None:
        previous = self.last_contact
        if not ok:
            self.unavailable += 1
        if previous is not None and previous[0] != ok:
            level = logging.INFO if ok else logging.WARNING
            log.log(level, "coordination engine %s: %s", "reachable" if ok else "down", detail)
        self.last_contact = (ok, detail, time.time())

    async def take(
        self,
        notice: str,
        instance: contract.InstanceData,
        *,
        action: str,
        deadline: datetime | None,
        wanted: Callable[[], bool],
    ) -> Grant:
        """A slot of the VM's group for `notice` (see the module docstring)."""
        settings = self.settings
        group = group_of(settings, instance)
        member = settings.member or instance.name
        started = time.monotonic()
        self.waiting += 1
        try:
            grant = await self._take(notice, group, member, action, deadline, wanted, started)
        finally:
            self.waiting -= 1
        if grant.outcome == "acquired" and not wanted():
            # The notice ended (or the bridge began to stop) while the slot was being taken.
            self.release(notice)
            self.takes[(action, "acquired")] -= 1
            self.takes[(action, "withdrawn")] += 1
            return dataclasses.replace(grant, outcome="withdrawn", acquired_at=None, slot=None)
        return grant

    async def _take(
        self,
        notice: str,
        group: str,
        member: str,
        action: str,
        deadline: datetime | None,
        wanted: Callable[[], bool],
        started: float,
    ) -> Grant:
        settings = self.settings
        announced = ""
        lock = self._locks.setdefault(group, asyncio.Lock())
        while True:
            if not wanted():
                return self._done(action, "withdrawn", group, member, started)
            async with lock:
                hold = self._holds.get(group)
                if hold is not None:
                    hold[1].add(notice)
                    return self._done(action, "acquired", group, member, started, hold[2], hold[3])
                try:
                    holder = await self.backend.acquire(group, member, settings.budget)
                except (Unavailable, EngineError) as exc:
                    self._contact(False, str(exc))
                    if settings.on_unavailable == "proceed":
                        log.warning(
                            "%s for %s goes ahead without a budget slot: the coordination "
                            "engine cannot be reached (on_unavailable = proceed): %s",
                            action,
                            notice,
                            exc,
                        )
                        return self._done(action, "unavailable", group, member, started)
                    if announced != "unavailable":
                        log.warning(
                            "%s for %s waits: the coordination engine cannot be reached "
                            "(on_unavailable = wait): %s",
                            action,
                            notice,
                            exc,
                        )
                        announced = "unavailable"
                else:
                    self._contact(True, f"answered ({self.settings.backend})")
                    if holder is not None:
                        at = self._clock()
                        self._holds[group] = (member, {notice}, at, holder.slot)
                        log.info(
                            "budget slot %s of %s taken by %s for %s",
                            holder.slot,
                            group,
                            member,
                            notice,
                        )
                        return self._done(
                            action, "acquired", group, member, started, at, holder.slot
                        )
                    if announced != "full":
                        log.info(
                            "%s for %s waits for a budget slot of %s (budget %d, all taken)",
                            action,
                            notice,
                            group,
                            settings.budget,
                        )
                        announced = "full"
            delay = settings.poll_interval
            if deadline is not None:
                left = (deadline - self._clock()).total_seconds()
                if left <= 0:
                    log.warning(
                        "%s for %s: no budget slot of %s before its deadline", action, notice, group
                    )
                    return self._done(action, "timed-out", group, member, started)
                delay = min(delay, left)
            await asyncio.sleep(delay)

    def _done(
        self,
        action: str,
        outcome: Outcome,
        group: str,
        member: str,
        started: float,
        at: datetime | None = None,
        slot: str | None = None,
    ) -> Grant:
        waited = time.monotonic() - started
        self.takes[(action, outcome)] += 1
        if waited >= self.settings.poll_interval:
            self.waits[action] += 1
            self.wait_seconds[action] = self.wait_seconds.get(action, 0.0) + waited
        return Grant(outcome, group, member, waited, at, slot)

    def _unrenewed(self, group: str, why: str) -> None:
        """The backend could not renew the slot of `group` by the local deadline: report it.
        The maintenance cannot be stopped; what it means is in docs/coordination.md."""
        hold = self._holds.get(group)
        if hold is None:
            return
        member, notices, acquired_at, slot = hold
        self.unrenewed += 1
        log.warning(
            "budget slot %s of %s held by %s for %s: its lease was not renewed by the local "
            "deadline (%s); it may expire at etcd %gs from now, and another member then take "
            "it while this maintenance goes on",
            slot,
            group,
            member,
            ", ".join(sorted(notices)),
            why,
            self.settings.lease_ttl / 4,
        )
        self.on_unrenewed(
            Unrenewed(
                group,
                member,
                slot,
                frozenset(notices),
                acquired_at,
                self._clock(),
                float(self.settings.lease_ttl),
                why,
            )
        )

    def release(self, notice: str) -> Released | None:
        """`notice` completed or was cancelled: give its slot back once no notice holds it;
        what was given back, if anything (for the audit event)."""
        for group, (member, notices, acquired_at, slot) in list(self._holds.items()):
            if notice not in notices:
                continue
            notices.discard(notice)
            if notices:
                continue
            del self._holds[group]
            log.info("budget slot %s of %s released by %s (%s ended)", slot, group, member, notice)
            task = asyncio.create_task(self._release(group, member), name="coordination:release")
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)
            return Released(group, member, slot, acquired_at, self._clock())
        return None

    async def _release(self, group: str, member: str) -> None:
        """Give the slot back, retried by the one policy until the engine answers (from
        `poll_interval`, doubling to the lease's TTL: by then the slot has expired anyway).
        A slot taken again meanwhile, for a new notice, is kept."""

        async def once() -> None:
            async with self._locks.setdefault(group, asyncio.Lock()):
                if group in self._holds:
                    return
                try:
                    await self.backend.release(group, member)
                except (Unavailable, EngineError) as exc:
                    self._contact(False, str(exc))
                    raise
                self._contact(True, f"answered ({self.settings.backend})")

        await retry_until_done(
            once,
            retry_on=(Unavailable, EngineError),
            initial=self.settings.poll_interval,
            maximum=float(self.settings.lease_ttl),
            before_sleep=retry_logger(
                log,
                f"cannot release the slot of {group} yet (it expires with the lease)",
                level=logging.WARNING,
            ),
        )

    def check(self) -> tuple[bool, str]:
        """For `/readyz`: can the budget be enforced right now?"""
        held = f"{self.held} slot(s) held"
        if self.last_contact is None:
            return True, f"{held}; engine not contacted yet"
        ok, detail, when = self.last_contact
        age = time.time() - when
        if ok:
            return True, f"{held}; engine answered {age:.0f}s ago"
        if self.settings.on_unavailable == "proceed":
            return True, f"{held}; engine unavailable, acting without slots: {detail}"
        return False, f"{held}; engine unavailable, disruptive actions wait: {detail}"

    async def probe(self) -> None:
        """Forever: ask the engine how it is every third of the lease time, so `/readyz` and
        the metrics show an outage before a disruptive action runs into it (cancel to stop)."""
        while True:
            try:
                detail = await self.backend.describe()
            except (Unavailable, EngineError) as exc:
                self._contact(False, str(exc))
            else:
                self._contact(True, detail)
            await asyncio.sleep(max(self.settings.poll_interval, self.settings.lease_ttl / 3))

    async def aclose(self) -> None:
        """Stop renewing (held slots expire with the lease: the maintenance may still run)."""
        if self._releases:
            _, late = await asyncio.wait(set(self._releases), timeout=self.settings.request_timeout)
            for task in late:
                task.cancel()  # etcd unreachable: the slot expires with the lease instead
            await asyncio.gather(*late, return_exceptions=True)
        await self.backend.aclose()

    def export(self, out: Exposition) -> None:
        """The budget's figures for `/metrics`: slots, waits, timeouts, engine health."""
        out.add(
            PREFIX + "coordination_slots_held",
            "gauge",
            "Budget slots this VM holds now (one per group, however many notices share it).",
            [({}, self.held)],
        )
        out.add(
            PREFIX + "coordination_waiting",
            "gauge",
            "Disruptive actions waiting for a budget slot now.",
            [({}, self.waiting)],
        )
        out.add(
            PREFIX + "coordination_takes_total",
            "counter",
            "Attempts to take a slot by action and outcome (acquired, timed-out, unavailable, "
            "withdrawn).",
            [({"action": a, "outcome": o}, n) for (a, o), n in sorted(self.takes.items())],
        )
        out.add(
            PREFIX + "coordination_waits_total",
            "counter",
            "Slot takes that had to wait, by action.",
            [({"action": a}, n) for a, n in sorted(self.waits.items())],
        )
        out.add(
            PREFIX + "coordination_wait_seconds_total",
            "counter",
            "Seconds spent waiting for a slot, by action.",
            [({"action": a}, s) for a, s in sorted(self.wait_seconds.items())],
        )
        out.add(
            PREFIX + "coordination_timeouts_total",
            "counter",
            "Slot takes that reached their deadline without a slot.",
            [({}, sum(n for (_, o), n in self.takes.items() if o == "timed-out"))],
        )
        out.add(
            PREFIX + "coordination_engine_errors_total",
            "counter",
            "Failed calls to the coordination engine (etcd unreachable or refusing).",
            [({}, self.unavailable)],
        )
        out.add(
            PREFIX + "coordination_slots_lost_total",
            "counter",
            "Held slots found gone (the lease expired while etcd could not be reached) and not "
            "taken back because others held the whole budget.",
            [({}, self.backend.lost)],
        )
        out.add(
            PREFIX + "coordination_slots_unrenewed_total",
            "counter",
            "Held slots whose lease was not renewed by the local deadline (3/4 of lease_ttl "
            "after the last renewal sent): another member may take them while the maintenance "
            "goes on.",
            [({}, self.unrenewed)],
        )
        contact = self.last_contact
        out.add(
            PREFIX + "coordination_up",
            "gauge",
            "1 when the coordination engine answered the last call.",
            [({}, 1 if contact is not None and contact[0] else 0)],
        )


def build(settings: Coordination) -> Budget:
    """The budget on the configured engine."""
    from bridge.actions.coordination.etcd import EtcdBackend

    return Budget(settings, EtcdBackend(settings))
