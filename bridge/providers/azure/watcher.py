"""Azure Instance Metadata Service: Scheduled Events.

Polls `/metadata/scheduledevents` (default once a second, the vendor's advice: some notices
give only 30 s) and diffs the document by `EventId`. Events are delivered to every VM of an
availability set or scale-set placement group, so only events whose `Resources` name this VM
are kept. Azure has no "completed" status: an event that disappears after `Started` has
completed. One that disappears while `Scheduled` was cancelled, unless it could have run:
its `NotBefore` has passed, or this VM approved it (an approved event starts at once). Then
it ran without the bridge seeing it start, and it is announced as completed with
`outcome_inferred`. That is common, not an edge case: a Freeze pauses the VM, so its
`Started` document is often never polled; a Reboot or Redeploy of this VM stops the bridge
with it; a short `Started` can fall between two polls.

After a restart the checkpoint holds the events last seen; the first poll compares against it,
so a transition that happened while the bridge was down is announced once, and one already
announced is not announced again. The same rule decides what an event last seen `Scheduled`
and gone after the gap became (typically: it rebooted this VM, and ran).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from bridge.infra.http1 import Response
from bridge.infra.timeparse import lenient_time
from bridge.pipeline.approver import ApprovalRejected
from bridge.pipeline.model import Instance, Kind, Notice, Origin, Provider, Status
from bridge.pipeline.watchers.base import (
    ClientWatcher,
    Update,
    fingerprint,
    load_json,
    plain_copy,
)
from bridge.pipeline.watchers.http import MetadataClient
from bridge.providers.azure.settings import AzureSource

log = logging.getLogger("bridge.watchers.azure")

INSTANCE_API_VERSION: Final = "2021-02-01"
KINDS: Final = {
    "Freeze": Kind.FREEZE,
    "Reboot": Kind.REBOOT,
    "Redeploy": Kind.REDEPLOY,
    "Preempt": Kind.PREEMPT,
    "Terminate": Kind.DELETE,
}
ORIGINS: Final = {"Platform": Origin.PLATFORM, "User": Origin.USER}
#: Answers to StartRequests that retrying cannot change (429 and 5xx are retried).
FINAL_APPROVAL_ERRORS: Final = (400, 401, 403, 404, 405, 409, 410, 422)


def new_client(config: AzureSource, **options: Any) -> MetadataClient:
    """A client for IMDS; `options` go to `MetadataClient` (tests: backoff).

    IMDS sends no vendor response header, so none can be required of its answers.
    """
    options.setdefault("timeout", config.request_timeout)
    return MetadataClient(config.imds_url, {"Metadata": "true"}, None, **options)


@dataclass(frozen=True, slots=True)
class Document:
    """A Scheduled Events document: the events that could be read, and those that could not.

    An event is refused (left out, logged once and counted) only when it cannot be told
    apart or attributed: not an object, no string `EventId`, or `Resources` not a list. Any
    other odd field costs that field, never the event (see `AzureWatcher._notice`).
    """

    incarnation: int
    events: list[dict[str, Any]]
    refused: list[tuple[str, str]] = field(default_factory=list)


def parse_document(body: bytes) -> Document:
    """Read a Scheduled Events document; ValueError when the document itself is not one."""
    document = load_json(body)
    if not isinstance(document, dict):
        raise ValueError("the document is not a JSON object")
    incarnation = document.get("DocumentIncarnation")
    events = document.get("Events")
    if not isinstance(incarnation, int) or not isinstance(events, list):
        raise ValueError("DocumentIncarnation (int) and Events (list) are required")
    kept: list[dict[str, Any]] = []
    refused: list[tuple[str, str]] = []
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            refused.append((f"#{index}", f"event #{index} is not an object"))
            continue
        event_id = event.get("EventId")
        if not isinstance(event_id, str) or not event_id:
            key = f"#{index}:{fingerprint(event)}"
            refused.append((key, f"event #{index} has no string EventId"))
        elif not isinstance(event.get("Resources", []), list):
            refused.append((event_id, f"event {event_id}: Resources is not a list"))
        else:
            kept.append(event)
    return Document(incarnation, kept, refused)


def _parse_instance(response: Response) -> dict[str, Any]:
    compute = response.json()["compute"]
    if not isinstance(compute, dict) or not compute.get("name"):
        raise ValueError("compute.name missing from /metadata/instance")
    return compute


class AzureWatcher(ClientWatcher[AzureSource]):
    """Polls Scheduled Events and announces the changes that concern this VM."""

    name = "azure"

    def _setup(self, checkpoint: dict[str, Any]) -> None:
        self._known: dict[str, dict[str, Any]] = dict(checkpoint.get("events", {}))
        self._incarnation: int | None = checkpoint.get("incarnation")
        self._first_call = True
        #: EventIds this bridge approved (StartRequests answered 200), here or in a run
        #: before a restart (the runner reads them from the spool): see `diff`.
        self.approved: set[str] = set(checkpoint.get("approved", ()))

    async def identify(self) -> Instance:
        if self.instance is not None:
            return self.instance
        response = await self._client.get(
            "instance",
            params={"api-version": INSTANCE_API_VERSION},
            timeout=self._config.first_call_timeout,
            validate=_parse_instance,
        )
        compute = _parse_instance(response)

        def text(key: str) -> str | None:
            value = compute.get(key)
            return str(value) if value not in (None, "") else None

        name = str(compute["name"])
        resource_id = text("resourceId") or (
            f"/subscriptions/{text('subscriptionId')}/resourceGroups/"
            f"{text('resourceGroupName')}/providers/Microsoft.Compute/virtualMachines/{name}"
        )
        self.instance = Instance(
            provider=Provider.AZURE,
            id=text("vmId") or name,
            name=name,
            source=resource_id,
            resource_id=resource_id,
            zone=text("zone"),
            location=text("location"),
            subscription=text("subscriptionId"),
            resource_group=text("resourceGroupName"),
            scale_set=text("vmScaleSetName"),
        )
        return self.instance

    async def _poll(self) -> tuple[int, list[dict[str, Any]]]:
        timeout = self._config.first_call_timeout if self._first_call else None
        # The document is read once, by the check of each answer: the last one read is the
        # answer's that passed (a poll a second, and every notice's way to the spool).
        read: list[Document] = []
        await self._client.get(
            "scheduledevents",
            params={"api-version": self._config.api_version},
            timeout=timeout,
            validate=lambda r: read.append(parse_document(r.body)),
        )
        self._first_call = False
        document = read[-1]
        for key, reason in document.refused:
            self._warn_once(key, "refused", "skipped an unreadable event: %s", reason)
        return document.incarnation, document.events

    def _warn_once(self, event_id: str, what: str, message: str, *args: object) -> None:
        """Log a problem with one event once, and count it (metric: metadata skipped)."""
        if (event_id, what) in self._warned:
            return
        self._warned.add((event_id, what))
        self.stats.skipped += 1
        log.warning(message, *args)

    def _mine(self, events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        assert self.instance is not None
        me = self.instance.name.casefold()
        return {
            event["EventId"]: event
            for event in events
            if any(str(r).casefold() == me for r in event.get("Resources", []))
        }

    def _not_before(self, event_id: str, value: object) -> datetime | None:
        """NotBefore, or None (with one warning) when it is not a time."""
        when, problem = lenient_time(value)
        if problem is not None:
            self._warn_once(
                event_id, "NotBefore", "event %s: NotBefore ignored: %s", event_id, problem
            )
        return when

    def _text(self, event_id: str, event: dict[str, Any], key: str) -> str | None:
        """A string field of the event; anything else is dropped (with one warning)."""
        value = event.get(key)
        if value is None or isinstance(value, str):
            return value or None
        self._warn_once(
            event_id,
            key,
            "event %s: %s is not a string (%s); ignored",
            event_id,
            key,
            type(value).__name__,
        )
        return None

    def _duration(self, event_id: str, value: object) -> int | None:
        """DurationInSeconds: -1 (unknown) and anything that is not a count are None."""
        if isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,9}\s*", value):
            value = int(value)  # a count sent as text is still that count
        if isinstance(value, int) and not isinstance(value, bool):
            return value if value >= 0 else None
        if value is not None:
            self._warn_once(
                event_id,
                "DurationInSeconds",
                "event %s: DurationInSeconds %r ignored",
                event_id,
                value,
            )
        return None

    def _notice(
        self,
        event: dict[str, Any],
        status: Status,
        revision: str,
        not_before: datetime | None,
        *,
        outcome_inferred: bool = False,
    ) -> Notice:
        assert self.instance is not None
        event_id: str = event["EventId"]
        return Notice(
            instance=self.instance,
            kind=KINDS.get(self._text(event_id, event, "EventType") or "", Kind.UNKNOWN),
            status=status,
            notice_id=event_id,
            observed_at=self._clock(),
            revision=revision,
            not_before=not_before,
            duration_seconds=self._duration(event_id, event.get("DurationInSeconds")),
            affected=tuple(str(r) for r in event.get("Resources", [])),
            origin=ORIGINS.get(self._text(event_id, event, "EventSource") or ""),
            description=self._text(event_id, event, "Description"),
            raw=event,
            outcome_inferred=outcome_inferred,
        )

    def diff(self, incarnation: int, events: list[dict[str, Any]]) -> list[Notice]:
        """Compare a document with what was last seen; update the memory; return notices."""
        now = self._clock()
        notices: list[Notice] = []
        mine = self._mine(events)
        for event_id, event in mine.items():
            known = self._known.get(event_id)
            if known is not None and known.get("event") == event:
                # Unchanged since the last poll, so is what was read of it (its status,
                # revision and NotBefore): nothing to announce, nothing to remember anew.
                # Parsing its NotBefore and fingerprinting it again cost each poll (once a
                # second, for the life of the VM) about 40 us per event already known.
                continue
            status_text = event.get("EventStatus")
            not_before = self._not_before(event_id, event.get("NotBefore"))
            if not_before is None and known:
                not_before = lenient_time(known.get("not_before"))[0]  # kept from Scheduled
            revision = ""
            if status_text == "Started":
                if not known or known["status"] != "Started":
                    notices.append(self._notice(event, Status.STARTED, "", not_before))
                status_text = "Started"
            else:
                if status_text != "Scheduled":
                    self._warn_once(
                        event_id,
                        f"EventStatus={status_text!r}",
                        "event %s has unknown EventStatus %r; treated as Scheduled",
                        event_id,
                        status_text,
                    )
                revision = fingerprint(event)
                if not known or known.get("revision") != revision:
                    notices.append(self._notice(event, Status.SCHEDULED, revision, not_before))
                status_text = "Scheduled"
            self._known[event_id] = {
                "status": status_text,
                "revision": revision,
                "not_before": not_before.isoformat() if not_before else None,
                "event": event,
            }
        for event_id in [e for e in self._known if e not in mine]:
            known = self._known.pop(event_id)
            not_before = lenient_time(known.get("not_before"))[0]
            # Gone while Scheduled, when it could have run: its time had come, or we approved
            # it (an approved event starts at once, whatever its NotBefore said). Live or
            # across a restart alike: see the module docstring.
            could_run = event_id in self.approved or (not_before is not None and not_before <= now)
            ran_unseen = known["status"] != "Started" and could_run
            status = (
                Status.COMPLETED if known["status"] == "Started" or ran_unseen else Status.CANCELLED
            )
            notices.append(
                self._notice(known["event"], status, "", not_before, outcome_inferred=ran_unseen)
            )
            self.approved.discard(event_id)
        self._incarnation = incarnation
        return notices

    def checkpoint(self) -> dict[str, Any]:
        state = {
            "incarnation": self._incarnation,
            "events": self._known,
            "approved": sorted(self.approved),
        }
        return plain_copy(state)

    async def watch(self) -> AsyncIterator[Update]:
        await self.identify()
        interval = self._config.poll_interval
        while True:
            started = time.monotonic()
            incarnation, events = await self._poll()
            notices = self.diff(incarnation, events)
            if notices:
                yield Update(tuple(notices), self.checkpoint())
            await self._sleep(max(0.0, interval - (time.monotonic() - started)))

    async def snapshot(self) -> list[Notice]:
        await self.identify()
        saved = self._known, self._incarnation
        self._known = {}
        try:
            return self.diff(*await self._poll())
        finally:
            self._known, self._incarnation = saved

    async def approve(self, event_id: str) -> None:
        """POST StartRequests for one event (retried like every IMDS call).

        A 4xx other than 429 is final (the event is unknown or over, or the request is
        malformed): it raises `ApprovalRejected` instead of being retried for ever.
        """
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
        response = await self._client.request(
            "POST",
            "scheduledevents",
            params={"api-version": self._config.api_version},
            content=body,
            accept=(200, *FINAL_APPROVAL_ERRORS),
        )
        if response.status != 200:
            raise ApprovalRejected(f"HTTP {response.status}: {response.text[:200]!r}")
        self.approved.add(event_id)
