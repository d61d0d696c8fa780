"""Google Compute Engine: `maintenance-event`, `preempted` and `upcoming-maintenance`.

Each key is read once without waiting (an event may already be under way after a restart),
then long-polled with `wait_for_change=true&last_etag=…&timeout_sec=…` and a client timeout
a little longer than `timeout_sec`. The key itself is queried, never a parent directory:
Compute Engine gives the 60-second live-migration warning only to VMs that query
`instance/maintenance-event` directly.

GCE numbers none of its notices, so a notice's id is an *episode* id derived from the key,
the value and the moment the value first appeared; it is kept in the checkpoint, so the
notice that ends an episode carries the id of the one that began it, across restarts.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Final

from tenacity import RetryCallState

from bridge.infra.backoff import keep_running, retry_logger
from bridge.infra.http1 import Response
from bridge.infra.timeparse import lenient_time
from bridge.pipeline.model import Instance, Kind, Notice, Provider, Status, Window
from bridge.pipeline.watchers.base import (
    ClientWatcher,
    Update,
    episode_id,
    fingerprint,
    load_json,
    plain_copy,
)
from bridge.pipeline.watchers.http import MetadataClient, RequestStats
from bridge.providers.gce.settings import GceSource

log = logging.getLogger("bridge.watchers.gce")

FLAVOR: Final = ("Metadata-Flavor", "Google")
MAINTENANCE_EVENT: Final = "instance/maintenance-event"
PREEMPTED: Final = "instance/preempted"
UPCOMING: Final = "instance/upcoming-maintenance"

#: The documented notice before the change takes effect, used to estimate `not_before`.
_NOTICE: Final = {
    "MIGRATE_ON_HOST_MAINTENANCE": (Kind.LIVE_MIGRATE, timedelta(seconds=60)),
    "TERMINATE_ON_HOST_MAINTENANCE": (Kind.TERMINATE, timedelta(minutes=60)),
}
_PREEMPT_NOTICE: Final = timedelta(seconds=30)
#: What a well-formed plain value looks like; anything else is a corrupted answer (retried).
_VALID: Final = {
    "project/project-id": re.compile(r"[a-z][-a-z0-9.:]{0,62}"),
    "instance/zone": re.compile(r"projects/[0-9]+/zones/[a-z0-9-]+"),
    "instance/id": re.compile(r"[0-9]+"),
    "instance/name": re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?"),
    "instance/scheduling/on-host-maintenance": re.compile(r"[A-Z_]+"),
    MAINTENANCE_EVENT: re.compile(r"[A-Z][A-Z0-9_]*"),
    PREEMPTED: re.compile(r"TRUE|FALSE"),
}
_NOTHING_SCHEDULED_BODIES: Final = frozenset({"", "{}", "NONE", "null"})
#: How a 503 says "nothing scheduled" rather than "try again" (seen on real servers).
_NO_NOTIFICATIONS: Final = "no notifications have been received yet"
_FIELDS: Final = {  # snake_case variant -> camelCase variant of upcoming-maintenance
    "type": "maintenanceType",
    "maintenance_status": "maintenanceStatus",
    "window_start_time": "windowStartTime",
    "window_end_time": "windowEndTime",
    "latest_window_start_time": "latestWindowStartTime",
    "can_reschedule": "canReschedule",
    "maintenance_reasons": "maintenanceReasons",
}


#: Longest a key waits for the runner to have spooled its update before it long-polls again.
_HANDLED_WAIT: Final = 0.25


async def _until_spooled(handled: asyncio.Future[None]) -> None:
    """Wait until the runner has spooled the update just queued (`watch` resolves `handled`
    when the runner asks for the next one), at most `_HANDLED_WAIT`, before this key's next
    long poll is sent.

    The commit runs on the spool's thread, which needs the GIL between its SQLite calls:
    while this loop builds and sends the next long poll, that thread waits, and so does the
    notice (the commit started 0.9 to 1 ms after it was asked for on a busy 2-core VM). Once
    the update is handled, the dispatcher (woken by the commit before this key) has written
    the notice's request; the long poll goes out right behind it. Waiting longer than that
    would be the only risk: a value that changes and changes back while no long poll hangs
    comes back with the ETag it had and is missed, so a runner still busy (a spool that
    keeps failing, retried with backoff) is not waited for beyond the bound."""
    if not handled.done():
        await asyncio.wait([handled], timeout=_HANDLED_WAIT)


#: What reaches `watch` from the keys' tasks: an update with the future `watch` resolves once
#: the runner is done with it (`_until_spooled`), or a key's task that ended (its exception).
_Updates = asyncio.Queue[tuple[Update, "asyncio.Future[None]"] | asyncio.Task[None]]


def new_client(config: GceSource, **options: Any) -> MetadataClient:
    """A client for the metadata server; `options` go to `MetadataClient` (tests: backoff)."""
    return MetadataClient(config.resolved_url(), {"Metadata-Flavor": "Google"}, FLAVOR, **options)


def _parse_bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


@dataclass(frozen=True, slots=True)
class Upcoming:
    """upcoming-maintenance in either field case, normalized."""

    maintenance_type: str | None
    status: str | None
    window: Window
    can_reschedule: bool | None
    reasons: tuple[str, ...]
    #: Fields that could not be read and were left out (logged once by the watcher).
    problems: tuple[str, ...] = ()


def parse_upcoming(status: int, body: str) -> dict[str, Any] | None:
    """The payload of upcoming-maintenance, or None for every "nothing scheduled" variant.

    Raises ValueError for an answer that is none of the known shapes (retried, never guessed).
    """
    text = body.strip()
    if status == 404:
        return None
    if status == 503:
        if _NO_NOTIFICATIONS in text:
            return None
        raise ValueError(f"HTTP 503: {text[:100]!r}")
    if text in _NOTHING_SCHEDULED_BODIES:
        return None
    value = load_json(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value or None


def normalize_upcoming(payload: dict[str, Any]) -> Upcoming:
    """The payload's fields; one that is not of its documented type is left out, alone."""
    problems: list[str] = []

    def get(snake: str) -> Any:
        return payload.get(snake, payload.get(_FIELDS[snake]))

    def text(snake: str) -> str | None:
        value = get(snake)
        if value is None or isinstance(value, str):
            return value or None
        problems.append(f"{snake} is not a string ({type(value).__name__})")
        return None

    def time(snake: str) -> datetime | None:
        when, problem = lenient_time(get(snake))
        if problem is not None:
            problems.append(f"{snake}: {problem}")
        return when

    reasons = get("maintenance_reasons") or ()
    return Upcoming(
        maintenance_type=text("type"),
        status=text("maintenance_status"),
        window=Window(
            start=time("window_start_time"),
            end=time("window_end_time"),
            latest_start=time("latest_window_start_time"),
        ),
        can_reschedule=_parse_bool(get("can_reschedule")),
        reasons=tuple(str(r) for r in reasons) if isinstance(reasons, list) else (),
        problems=tuple(problems),
    )


def _validator(key: str) -> Callable[[Response], None]:
    """Raises ValueError for an answer to `key` that is not of its documented shape."""

    def validate(response: Response) -> None:
        if key == UPCOMING:
            parse_upcoming(response.status, response.text)
            return
        if response.status != 200:
            return
        pattern = _VALID.get(key)
        text = response.text.strip()
        if pattern is not None and not pattern.fullmatch(text):
            raise ValueError(f"{key} = {text[:60]!r} is not a valid value")

    return validate


class GceWatcher(ClientWatcher[GceSource]):
    """Watches the three maintenance keys of the GCE metadata server."""

    name = "gce"

    def _setup(self, checkpoint: dict[str, Any]) -> None:
        self._checkpoint = checkpoint
        self._on_host_maintenance: str | None = None
        #: Per key: its own request counters (readiness has one line per key).
        self.key_stats: dict[str, RequestStats] = {key: RequestStats() for key in self._keys()}

    async def _text(self, key: str) -> str:
        return (await self._client.get(key, validate=_validator(key))).text.strip()

    async def identify(self) -> Instance:
        if self.instance is not None:
            return self.instance
        project = await self._text("project/project-id")
        zone_path = await self._text("instance/zone")
        instance_id = await self._text("instance/id")
        name = await self._text("instance/name")
        policy = await self._client.get(
            "instance/scheduling/on-host-maintenance",
            accept=(200, 404),
            validate=_validator("instance/scheduling/on-host-maintenance"),
        )
        self._on_host_maintenance = policy.text.strip() if policy.status == 200 else None
        zone = zone_path.rsplit("/", 1)[-1]
        region = zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else None
        resource = f"projects/{project}/zones/{zone}/instances/{name}"
        self.instance = Instance(
            provider=Provider.GCE,
            id=instance_id,
            name=name,
            source=f"//compute.googleapis.com/{resource}",
            resource_id=resource,
            zone=zone,
            location=region,
            project=project,
        )
        return self.instance

    # -- state machines: pure functions of (previous key state, new value) ------------------

    def _flag_transition(
        self, key: str, previous: dict[str, Any], value: str, etag: str | None
    ) -> tuple[list[Notice], dict[str, Any]]:
        """maintenance-event and preempted: an idle value, and episodes of other values."""
        idle = "FALSE" if key == PREEMPTED else "NONE"
        old_value = previous.get("value", idle)
        raw = {"key": key, "value": value, "etag": etag}
        state = {**previous, "value": value, "etag": etag}
        if value == old_value:
            return [], state
        notices: list[Notice] = []
        if old_value != idle and previous.get("notice_id"):
            notices.append(
                self._vm_notice(
                    Kind(previous["kind"]),
                    Status.COMPLETED,
                    previous["notice_id"],
                    not_before=lenient_time(previous.get("not_before"))[0],
                    not_before_estimated=bool(previous.get("not_before")),
                    description=f"{key} returned to {value}",
                    raw=raw,
                )
            )
            state.update(notice_id=None, kind=None, not_before=None)
        if value != idle:
            now = self._clock()
            notice: timedelta | None
            if key == PREEMPTED:
                kind, notice = Kind.PREEMPT, _PREEMPT_NOTICE
                description = "Spot/preemptible VM is being preempted; it stops in about 30 s"
            else:
                kind, notice = _NOTICE.get(value, (Kind.UNKNOWN, None))
                description = {
                    Kind.LIVE_MIGRATE: "Host maintenance: live migration begins in about 60 s",
                    Kind.TERMINATE: "Host maintenance: the VM is stopped in about 60 min",
                }.get(kind, f"Host maintenance event {value}")
            not_before = now + notice if notice is not None else None
            assert self.instance is not None
            notice_id = episode_id(self.instance.id, key, value, now.isoformat())
            notices.append(
                self._vm_notice(
                    kind,
                    Status.STARTED,
                    notice_id,
                    not_before=not_before,
                    not_before_estimated=not_before is not None,
                    description=description,
                    raw=raw,
                )
            )
            state.update(
                notice_id=notice_id,
                kind=kind.value,
                not_before=not_before.isoformat() if not_before else None,
            )
        return notices, state

    def _upcoming_kind(self) -> Kind:
        return {"MIGRATE": Kind.LIVE_MIGRATE, "TERMINATE": Kind.TERMINATE}.get(
            self._on_host_maintenance or "", Kind.UNKNOWN
        )

    def _upcoming_transition(
        self, previous: dict[str, Any], payload: dict[str, Any] | None, etag: str | None
    ) -> tuple[list[Notice], dict[str, Any]]:
        old = previous.get("payload")
        state = {**previous, "payload": payload, "etag": etag}
        if payload == old:
            return [], state
        raw = {"key": UPCOMING, "value": payload, "etag": etag}
        if payload is None:
            assert old is not None
            status = (
                Status.COMPLETED
                if previous.get("status") == Status.STARTED.value
                else Status.CANCELLED
            )
            upcoming = self._normalize(old)
            notice = self._upcoming_notice(upcoming, status, previous["notice_id"], "", raw)
            state.update(notice_id=None, status=None)
            return [notice], state
        upcoming = self._normalize(payload)
        status = Status.STARTED if upcoming.status == "ONGOING" else Status.SCHEDULED
        notice_id = previous.get("notice_id")
        if not notice_id:
            assert self.instance is not None
            notice_id = episode_id(self.instance.id, UPCOMING, self._clock().isoformat())
        # The first `started` is one transition; any other announcement (scheduled, or fields
        # changed while ongoing) is told apart by its content.
        first_start = status == Status.STARTED and previous.get("status") != Status.STARTED.value
        revision = "" if first_start else fingerprint(payload)
        notice = self._upcoming_notice(upcoming, status, notice_id, revision, raw)
        state.update(notice_id=notice_id, status=status.value)
        return [notice], state

    def _normalize(self, payload: dict[str, Any]) -> Upcoming:
        """`normalize_upcoming`, logging (once per payload) and counting what it left out."""
        upcoming = normalize_upcoming(payload)
        digest = fingerprint(payload)
        for problem in upcoming.problems:
            if (digest, problem) not in self._warned:
                self._warned.add((digest, problem))
                self.stats.skipped += 1
                log.warning("%s: field ignored: %s", UPCOMING, problem)
        return upcoming

    def _upcoming_notice(
        self, upcoming: Upcoming, status: Status, notice_id: str, revision: str, raw: Any
    ) -> Notice:
        window = upcoming.window
        parts = [f"{(upcoming.maintenance_type or 'Scheduled').capitalize()} host maintenance"]
        if window.start and window.end:
            parts.append(f"window {window.start.isoformat()} to {window.end.isoformat()}")
        if upcoming.reasons:
            parts.append("reasons: " + ", ".join(upcoming.reasons))
        return self._vm_notice(
            self._upcoming_kind(),
            status,
            notice_id,
            revision=revision,
            not_before=window.start,
            window=window,
            can_reschedule=upcoming.can_reschedule,
            description="; ".join(parts),
            raw=raw,
        )

    # -- reading the keys -------------------------------------------------------------------

    def _keys(self) -> list[str]:
        keys = [MAINTENANCE_EVENT]
        if self._config.watch_preempted:
            keys.append(PREEMPTED)
        if self._config.watch_upcoming:
            keys.append(UPCOMING)
        return keys

    async def _read(self, key: str, etag: str | None) -> tuple[int, str, str | None]:
        """The key's value: at once when `etag` is None, else when it changes (or times out)."""
        accept = (200, 404, 503) if key == UPCOMING else (200,)
        params: dict[str, str] | None = None
        timeout: float | None = None
        if etag is not None:
            wait = self._config.long_poll_timeout
            params = {"wait_for_change": "true", "last_etag": etag, "timeout_sec": str(wait)}
            timeout = wait + 10.0

        response = await self._client.get(
            key,
            params=params,
            timeout=timeout,
            accept=accept,
            validate=_validator(key),
            track=self.key_stats.get(key),
            # A long poll's answer is a notice: on a connection of its own, which the kernel
            # acknowledges on arrival, so a two-send answer arrives whole (bridge.infra.http1).
            fresh=etag is not None,
        )
        new_etag = response.headers.get("etag") if response.status == 200 else None
        return response.status, response.text, new_etag

    def _apply(self, key: str, status: int, body: str, etag: str | None) -> list[Notice]:
        previous = self._checkpoint.get(key, {})
        if key == UPCOMING:
            notices, state = self._upcoming_transition(previous, parse_upcoming(status, body), etag)
        else:
            notices, state = self._flag_transition(key, previous, body.strip(), etag)
        self._checkpoint[key] = state
        return notices

    async def _follow(self, key: str, queue: _Updates) -> None:
        """Follow one key for ever. A value this watcher cannot turn into notices fails this
        key alone (logged, counted, and after the one policy's pause from 1 s, doubling to
        60 s, read again at once), never the other keys."""
        log_failure = retry_logger(log, f"{key}: cannot read the new value", traceback=True)

        def failed(state: RetryCallState) -> None:
            self.key_stats[key].failed("unreadable")
            log_failure(state)

        await keep_running(
            partial(self._follow_once, key, queue),
            retry_on=Exception,
            initial=1.0,
            maximum=60.0,
            before_sleep=failed,
            sleep=self._sleep,
        )

    async def _follow_once(self, key: str, queue: _Updates, progressed: Callable[[], None]) -> None:
        """Read `key` from scratch (no ETag), then wait on its changes, until a value cannot
        be read; `progressed` after each value applied (the next failure pauses 1 s again)."""
        etag: str | None = None
        while True:
            status, body, new_etag = await self._read(key, etag)  # retries until it succeeds
            if etag is not None and new_etag == etag:
                continue  # timeout_sec elapsed with no change
            notices = self._apply(key, status, body, new_etag)
            progressed()
            if notices:
                handled = asyncio.get_running_loop().create_future()
                queue.put_nowait((Update(tuple(notices), self.checkpoint()), handled))
                await _until_spooled(handled)
            if new_etag is None:
                # No ETag to wait on (upcoming-maintenance says "nothing" with 404/503, or an
                # odd server): poll at a calm interval instead of spinning.
                await self._sleep(self._config.upcoming_poll_interval if key == UPCOMING else 1.0)
            etag = new_etag

    def checkpoint(self) -> dict[str, Any]:
        return plain_copy(self._checkpoint)

    @property
    def parts(self) -> dict[str, RequestStats]:
        return self.key_stats

    async def watch(self) -> AsyncIterator[Update]:
        await self.identify()
        # One queue carries both the updates and the keys' tasks that end, so each update
        # wakes this loop once: waiting on the queue and the tasks together (a getter task
        # and `asyncio.wait` per update) took three turns of the event loop, cold, on every
        # notice's way to the spool.
        queue: _Updates = asyncio.Queue()
        tasks = [asyncio.create_task(self._follow(key, queue), name=key) for key in self._keys()]
        for task in tasks:
            task.add_done_callback(queue.put_nowait)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, asyncio.Task):
                    item.result()  # a key task died: surface its exception to the runner
                    continue
                update, handled = item
                try:
                    yield update
                finally:  # the runner is done with it (or the watch ends)
                    if not handled.done():
                        handled.set_result(None)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def snapshot(self) -> list[Notice]:
        await self.identify()
        saved, self._checkpoint = self._checkpoint, {}
        try:
            notices: list[Notice] = []
            for key in self._keys():
                status, body, etag = await self._read(key, None)
                notices += self._apply(key, status, body, etag)
            return notices
        finally:
            self._checkpoint = saved
