"""The notices in force now: a component of its own, written by the runner, read by the
actions (is this notice still Scheduled?) and the status API (`/v1/notices`, `/v1/eligible`).

Keyed by (watcher, notice id), it holds the last event of every notice that has not completed
or been cancelled. The spool keeps the same set durably (in the transaction that spools the
events), so a restart restores it with `restore` before any watcher runs.
"""

from __future__ import annotations

from collections.abc import Mapping

from cloudevents.core.v1.event import CloudEvent

from bridge.infra.encoding import parse
from bridge.pipeline.events import TYPE_PREFIX
from bridge.pipeline.model import Notice, Status

_ENDED = (Status.COMPLETED, Status.CANCELLED)


class InForce:
    def __init__(self) -> None:
        self._events: dict[tuple[str, str], CloudEvent] = {}

    def __len__(self) -> int:
        return len(self._events)

    def remember(self, name: str, notice: Notice, event: CloudEvent) -> None:
        """`notice`, announced by `event`, as the watcher `name` saw it last."""
        key = (name, notice.notice_id)
        if notice.status in _ENDED:
            self._events.pop(key, None)
        else:
            self._events[key] = event

    def restore(self, spooled: Mapping[str, bytes]) -> None:
        """What the spool held in force (`Spool.in_force`: "<watcher>\\t<notice id>" -> event)."""
        for key, body in spooled.items():
            name, notice_id = key.split("\t", 1)
            self._events[(name, notice_id)] = parse(body)

    def events(self) -> list[CloudEvent]:
        return list(self._events.values())

    def is_scheduled(self, source: str, notice_id: str) -> bool:
        """Whether that notice is in force and still Scheduled (an approval is only sent then)."""
        return any(
            key[1] == notice_id
            and event.get_source() == source
            and event.get_type() == TYPE_PREFIX + Status.SCHEDULED.value
            for key, event in self._events.items()
        )
