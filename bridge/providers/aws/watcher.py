"""AWS EC2 instance metadata (IMDSv2): Spot interruptions, rebalance recommendations,
scheduled events and the Auto Scaling lifecycle state, mapped onto the one contract.

Four signals, none of them pushed, so all are polled: the Spot instance-action and the
rebalance recommendation every `poll_interval` (a Spot interruption gives two minutes), the
scheduled events and the target lifecycle state every `maintenance_poll_interval` (they give
days, or the lifecycle hook's minutes). 404 means "nothing" on every path. Only the Spot
notice is retried until read; the other paths are read once per poll, so that one that keeps
failing never holds up the two-minute warning (a failed read changes nothing).

| IMDS                                        | kind      | status                       |
|---------------------------------------------|-----------|------------------------------|
| spot/instance-action appears                | preempt   | started (not_before = time)  |
| spot/instance-action goes away              | preempt   | completed                    |
| events/recommendations/rebalance appears    | preempt   | scheduled (no time)          |
| ... then the Spot interruption begins       | preempt   | completed (superseded)       |
| ... or it goes away                         | preempt   | cancelled                    |
| scheduled event `active`                    | by Code   | scheduled                    |
| scheduled event in an in-progress state     | by Code   | started (only if IMDS says)  |
| scheduled event `completed` / `canceled`    | by Code   | completed / cancelled        |
| scheduled event leaves the list             | by Code   | as events/maintenance/history says |
| autoscaling/target-lifecycle-state `*Terminated` | delete | started                   |

Codes: `instance-reboot`, `system-reboot` → reboot; `instance-stop`, `instance-retirement` →
terminate; `system-maintenance` and anything else → unknown. AWS documents only `active`,
`completed` and `canceled` as States, so a scheduled event is never declared started from
the clock: only a State the platform reports (`in-progress`, `started`, `ongoing`) does it.

Restarts are handled like the other watchers: the checkpoint holds what was announced, the
first poll after a restart compares against it, and an event that left the list while the
bridge was down is looked up in the history rather than guessed.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, TypeVar

from bridge.infra.timeparse import parse_optional_time, parse_time
from bridge.pipeline.model import Instance, Kind, Notice, Provider, Status, Window
from bridge.pipeline.watchers.base import ClientWatcher, Update, fingerprint, plain_copy
from bridge.pipeline.watchers.http import MetadataClient, MetadataError
from bridge.providers.aws import imds
from bridge.providers.aws.settings import AwsSource

log = logging.getLogger("bridge.watchers.aws")
T = TypeVar("T")

CODE_KINDS: Final = {
    "instance-reboot": Kind.REBOOT,
    "system-reboot": Kind.REBOOT,
    "instance-stop": Kind.TERMINATE,
    "instance-retirement": Kind.TERMINATE,
    "system-maintenance": Kind.UNKNOWN,
}
#: States AWS does not document but a scheduled event under way could show.
STARTED_STATES: Final = frozenset({"in-progress", "started", "ongoing"})
ENDED_STATES: Final = {
    "completed": Status.COMPLETED,
    "canceled": Status.CANCELLED,
    "cancelled": Status.CANCELLED,
}


def new_client(config: AwsSource, **options: Any) -> MetadataClient:
    """A client for IMDS; `options` go to `MetadataClient` (tests: backoff).

    IMDS needs no fixed request header (the session token is added per request) and sends
    no vendor response header that could be required.
    """
    options.setdefault("timeout", config.request_timeout)
    return MetadataClient(config.imds_url, {}, None, **options)


def notice_id_of(signal: str, *parts: str) -> str:
    """An id for a notice AWS does not number (spot, rebalance, lifecycle): the signal, the
    instance and the time or state that began it, so a later notice gets a new id."""
    return f"aws-{signal}-" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def instance_of(document: dict[str, Any]) -> Instance:
    """The VM identity from the instance identity document.

    The CloudEvents source is the instance's ARN (`arn:aws:ec2:<region>:<account>:instance/
    <id>`): globally unique, and what AWS itself names the instance by in EventBridge.
    """
    region, account, instance_id = (
        document["region"],
        document["accountId"],
        document["instanceId"],
    )
    arn = f"arn:{imds.arn_partition(region)}:ec2:{region}:{account}:instance/{instance_id}"

    def text(key: str) -> str | None:
        value = document.get(key)
        return str(value) if value not in (None, "") else None

    return Instance(
        provider=Provider.AWS,
        id=instance_id,
        name=instance_id,
        source=arn,
        resource_id=arn,
        zone=text("availabilityZone"),
        location=region,
        account=account,
        instance_type=text("instanceType"),
    )


class AwsWatcher(ClientWatcher[AwsSource]):
    """Polls the four AWS signals and announces their changes (see the module docstring)."""

    name = "aws"

    #: The clock a session token's lifetime is measured with (a seam for tests).
    _monotonic: Callable[[], float] = staticmethod(time.monotonic)

    def _setup(self, checkpoint: dict[str, Any]) -> None:
        config = self._config
        self.session = imds.TokenSession(
            self._client, config.token_ttl, config.imds_v1_fallback, self._monotonic
        )
        self._restore(checkpoint)
        self._next_maintenance = 0.0
        #: Paths whose last single-attempt read failed (logged once per streak).
        self._failing: set[str] = set()

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        self._spot: dict[str, Any] | None = checkpoint.get("spot")
        self._rebalance: dict[str, Any] | None = checkpoint.get("rebalance")
        self._events: dict[str, dict[str, Any]] = dict(checkpoint.get("events", {}))
        self._lifecycle: dict[str, Any] | None = checkpoint.get("lifecycle")

    def checkpoint(self) -> dict[str, Any]:
        state = {
            "spot": self._spot,
            "rebalance": self._rebalance,
            "events": self._events,
            "lifecycle": self._lifecycle,
        }
        return plain_copy(state)

    # -- reading IMDS ------------------------------------------------------------------------
    async def _read(self, path: str, parse: Callable[[bytes], T]) -> T | None:
        """GET `path` with the session token; None on 404. A 401 renews the token at once;
        401s that keep coming after a renewal back off like any other failure."""
        unauthorized = 0
        while True:
            headers = await self.session.headers()
            response = await self._client.request(
                "GET",
                path,
                accept=(200, 401, 404),
                headers=headers,
                validate=lambda r: r.status != 200 or parse(r.body),
            )
            if response.status == 404:
                return None
            if response.status == 200:
                return parse(response.body)
            self._client.stats.failed("401")
            self.session.invalidate()
            unauthorized += 1
            if unauthorized > 1:
                delay = self._client.retry_initial * 2 ** (unauthorized - 2)
                await self._sleep(min(delay, self._client.retry_max))

    async def _attempt(self, path: str, parse: Callable[[bytes], T]) -> tuple[bool, T | None]:
        """One read that may fail without holding up the other signals: (read, value).

        Every path but the Spot notice is read this way: a rebalance or scheduled-events
        answer that stays broken must not stall the two-minute warning. A failure leaves
        that signal's state as it was, and the next poll tries again; a 401 renews the
        token and tries once more at once.
        """
        for _ in range(2):
            headers = await self.session.headers()
            try:
                response = await self._client.request_once(
                    "GET", path, accept=(200, 401, 404), headers=headers
                )
                if response.status == 404:
                    self._recovered(path)
                    return True, None
                if response.status == 200:
                    value = self._parsed(response.body, parse)
                    self._recovered(path)
                    return True, value
            except (MetadataError, ValueError) as exc:
                self._failed(path, exc)
                return False, None
            self._client.stats.failed("401")
            self.session.invalidate()
        self._failed(path, "HTTP 401 with a fresh token")
        return False, None

    def _parsed(self, body: bytes, parse: Callable[[bytes], T]) -> T:
        try:
            return parse(body)
        except ValueError:
            self._client.stats.failed("malformed")
            raise

    def _failed(self, path: str, why: object) -> None:
        first = path not in self._failing
        self._failing.add(path)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "%s: %s; the other signals go on, this one is read again at the next poll",
            path,
            why,
        )

    def _recovered(self, path: str) -> None:
        if path in self._failing:
            self._failing.discard(path)
            log.info("%s: readable again", path)

    async def identify(self) -> Instance:
        if self.instance is None:
            document = await self._read(imds.IDENTITY_PATH, imds.parse_identity)
            while document is None:  # 404: not an EC2 instance (yet); keep asking
                self._client.stats.failed("404")
                await self._sleep(self._client.retry_max)
                document = await self._read(imds.IDENTITY_PATH, imds.parse_identity)
            self.instance = instance_of(document)
        return self.instance

    # -- the mapping -------------------------------------------------------------------------
    def _notice(
        self, kind: Kind, status: Status, notice_id: str, raw: Any, **fields: Any
    ) -> Notice:
        """`revision`, `not_before`, `window`, `description`, `can_reschedule` as read."""
        return self._vm_notice(kind, status, notice_id, raw=raw, **fields)

    def _spot_notice(self, known: dict[str, Any], status: Status, revision: str = "") -> Notice:
        body = known["body"]
        return self._notice(
            Kind.PREEMPT,
            status,
            known["notice_id"],
            body,
            revision=revision,
            not_before=parse_time(body["time"]),
            description=f"Spot interruption: the instance will {body['action']}",
        )

    def diff_spot(self, action: dict[str, Any] | None) -> list[Notice]:
        """instance-action: started when it appears, completed when it goes away."""
        assert self.instance is not None
        known = self._spot
        if action is None:
            self._spot = None
            return [self._spot_notice(known, Status.COMPLETED)] if known else []
        revision = fingerprint(action)
        if known is None:
            notice_id = notice_id_of("spot", self.instance.id, str(action["time"]))
            self._spot = {"notice_id": notice_id, "revision": revision, "body": action}
            notices = [self._spot_notice(self._spot, Status.STARTED)]
            return notices + self._supersede_rebalance()
        if known["revision"] != revision:  # the time or the action changed: say it again
            self._spot = {**known, "revision": revision, "body": action}
            return [self._spot_notice(self._spot, Status.STARTED, revision)]
        return []

    def _rebalance_notice(self, known: dict[str, Any], status: Status, why: str) -> Notice:
        return self._notice(
            Kind.PREEMPT,
            status,
            known["notice_id"],
            known["body"],
            description=f"EC2 instance rebalance recommendation: {why}",
        )

    def diff_rebalance(self, recommendation: dict[str, Any] | None) -> list[Notice]:
        """A rebalance recommendation: a scheduled preemption without a time."""
        assert self.instance is not None
        known = self._rebalance
        notices: list[Notice] = []
        if known is not None and (
            recommendation is None or recommendation.get("noticeTime") != known["noticeTime"]
        ):
            self._rebalance = None
            if not known["ended"]:
                notices.append(self._rebalance_notice(known, Status.CANCELLED, "withdrawn"))
            known = None
        if recommendation is not None and known is None:
            notice_time = str(recommendation["noticeTime"])
            self._rebalance = {
                "notice_id": notice_id_of("rebalance", self.instance.id, notice_time),
                "noticeTime": notice_time,
                "ended": False,
                "body": recommendation,
            }
            why = "elevated risk of a Spot interruption"
            notices.append(self._rebalance_notice(self._rebalance, Status.SCHEDULED, why))
        return notices

    def _supersede_rebalance(self) -> list[Notice]:
        """The interruption the recommendation warned of has begun: the recommendation is
        over (IMDS keeps serving it, so it is remembered as ended, not forgotten)."""
        known = self._rebalance
        if known is None or known["ended"]:
            return []
        known["ended"] = True
        why = "superseded by the Spot interruption notice"
        return [self._rebalance_notice(known, Status.COMPLETED, why)]

    def _event_notice(self, event: dict[str, Any], status: Status, revision: str = "") -> Notice:
        not_before = parse_optional_time(event.get("NotBefore"))
        deadline = parse_optional_time(event.get("NotBeforeDeadline"))
        return self._notice(
            CODE_KINDS.get(str(event.get("Code")), Kind.UNKNOWN),
            status,
            str(event["EventId"]),
            event,
            revision=revision,
            not_before=not_before,
            window=Window(not_before, parse_optional_time(event.get("NotAfter")), deadline),
            description=str(event.get("Description") or "") or None,
            # only an event with a deadline can be rescheduled (ModifyInstanceEventStartTime)
            can_reschedule=deadline is not None,
        )

    def diff_scheduled(
        self, events: list[dict[str, Any]], history: list[dict[str, Any]] | None
    ) -> list[Notice]:
        """The scheduled events list against what was announced; `history` tells how the
        events that left the list ended (None: it was not needed, or is unknown)."""
        notices: list[Notice] = []
        seen = {str(event["EventId"]): event for event in events}
        for event_id, event in seen.items():
            known = self._events.get(event_id)
            state = str(event.get("State", "")).lower()
            if state in ENDED_STATES:
                if known is not None and known["status"] not in ("completed", "cancelled"):
                    status = ENDED_STATES[state]
                    notices.append(self._event_notice(event, status))
                    self._events[event_id] = {"status": status.value, "event": event}
                continue  # an event that ended before we saw it is not news
            if state in STARTED_STATES:
                if known is None or known["status"] != "started":
                    notices.append(self._event_notice(event, Status.STARTED))
                self._events[event_id] = {"status": "started", "event": event}
                continue
            if state != "active":
                log.warning(
                    "scheduled event %s has unknown State %r; treated as active", event_id, state
                )
            revision = fingerprint(event)
            if known is None or (known["status"] == "scheduled" and known["revision"] != revision):
                notices.append(self._event_notice(event, Status.SCHEDULED, revision))
            self._events[event_id] = {"status": "scheduled", "revision": revision, "event": event}
        ended = {e["EventId"]: e for e in history or [] if isinstance(e.get("EventId"), str)}
        for event_id in [e for e in self._events if e not in seen]:
            known = self._events.pop(event_id)
            if known["status"] in ("completed", "cancelled"):
                continue
            notices.append(self._left_notice(known, ended.get(event_id)))
        return notices

    def _left_notice(self, known: dict[str, Any], past: dict[str, Any] | None) -> Notice:
        """An event gone from the list: the history says how it ended; without it, one whose
        NotBefore passed ran (completed), one still ahead was cancelled."""
        event = known["event"]
        state = str(past.get("State", "")).lower() if past else ""
        if state in ENDED_STATES:
            return self._event_notice(past or event, ENDED_STATES[state])
        not_before = parse_optional_time(event.get("NotBefore"))
        ran = known["status"] == "started" or (
            not_before is not None and not_before <= self._clock()
        )
        return self._event_notice(event, Status.COMPLETED if ran else Status.CANCELLED)

    def diff_lifecycle(self, state: str | None) -> list[Notice]:
        """`Terminated` (or `Warmed:Terminated`): the Auto Scaling group deletes this VM."""
        assert self.instance is not None
        known = self._lifecycle or {}
        announced = bool(known.get("notice_id"))
        terminating = state is not None and state.endswith("Terminated")
        if terminating and announced:
            return []
        if terminating:
            assert state is not None
            notice_id = notice_id_of("lifecycle", self.instance.id, state)
            self._lifecycle = {"notice_id": notice_id, "state": state}
            return [self._lifecycle_notice(self._lifecycle, Status.STARTED)]
        self._lifecycle = {"state": state} if state else None
        return [self._lifecycle_notice(known, Status.COMPLETED)] if announced else []

    def _lifecycle_notice(self, known: dict[str, Any], status: Status) -> Notice:
        state = known["state"]
        return self._notice(
            Kind.DELETE,
            status,
            known["notice_id"],
            {"target-lifecycle-state": state},
            description=f"Auto Scaling target lifecycle state: {state}",
        )

    # -- polling -----------------------------------------------------------------------------
    async def _poll(self, maintenance: bool) -> list[Notice]:
        """Read the signals due, then diff them (the rebalance recommendation first, so that
        it comes before an interruption seen in the same poll)."""
        rebalance_read, recommendation = await self._attempt(
            imds.REBALANCE_PATH, imds.parse_rebalance
        )
        action = await self._read(imds.SPOT_PATH, imds.parse_instance_action)
        notices = self.diff_rebalance(recommendation) if rebalance_read else []
        notices += self.diff_spot(action)
        if maintenance:
            notices += await self._poll_scheduled()
            lifecycle_read, state = await self._attempt(imds.LIFECYCLE_PATH, imds.parse_lifecycle)
            if lifecycle_read:
                notices += self.diff_lifecycle(state)
        return notices

    async def _poll_scheduled(self) -> list[Notice]:
        """The scheduled events, and the history when an event left the list; nothing is
        decided on a failed read (an event is never guessed over because history failed)."""
        read, events = await self._attempt(imds.SCHEDULED_PATH, imds.parse_scheduled)
        if not read:
            return []
        listed = {e["EventId"] for e in events or []}
        history = None
        if any(event_id not in listed for event_id in self._events):
            read, history = await self._attempt(imds.HISTORY_PATH, imds.parse_scheduled)
            if not read:
                return []
        return self.diff_scheduled(events or [], history)

    async def watch(self) -> AsyncIterator[Update]:
        await self.identify()
        while True:
            started = self._monotonic()
            maintenance = started >= self._next_maintenance
            if maintenance:
                self._next_maintenance = started + self._config.maintenance_poll_interval
            notices = await self._poll(maintenance)
            if notices:
                yield Update(tuple(notices), self.checkpoint())
            elapsed = self._monotonic() - started
            await self._sleep(max(0.0, self._config.poll_interval - elapsed))

    async def snapshot(self) -> list[Notice]:
        await self.identify()
        saved = self.checkpoint()
        self._restore({})
        try:
            return await self._poll(maintenance=True)
        finally:
            self._restore(saved)
