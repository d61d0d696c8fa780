"""The notices in force now: a component of its own, written by the runner, read by the
actions (is this notice still Scheduled?) and the status API (`/v1/notices`, `/v1/eligible`).

Keyed by (watcher, notice id), it holds the last event of every notice that has not completed
or been cancelled, as the typed `contract.Event` the runner decoded once for the actions and
this component alike. The spool keeps the same set durably (in the transaction that spools
the events), so a restart restores it with `restore` before any watcher runs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from bridge import contract
from bridge.pipeline.typed_events import maintenance

log = logging.getLogger("bridge.in_force")

_ENDED = ("completed", "cancelled")


class InForce:
    def __init__(self) -> None:
        self._events: dict[tuple[str, str], contract.Event] = {}

    def __len__(self) -> int:
        return len(self._events)

    def remember(self, name: str, event: contract.Event) -> None:
        """The maintenance `event`, as the watcher `name` announced it last."""
        data = maintenance(event)
        key = (name, data.notice_id)
        if data.status in _ENDED:
            self._events.pop(key, None)
        else:
            self._events[key] = event

    def restore(self, spooled: Mapping[str, bytes]) -> None:
        """What the spool held in force (`Spool.in_force`: "<watcher>\\t<notice id>" -> event).

        An entry that is not a maintenance event of schema v1 (it cannot be: the sidecar
        wrote it) is logged and left out rather than stop the start-up: a crash loop would
        watch nothing at all, and the watcher announces the notice again if it is still on.
        """
        for key, body in spooled.items():
            name, notice_id = key.split("\t", 1)
            try:
                event = contract.from_cloudevent(body)
                maintenance(event)
            except contract.ContractError as exc:
                log.error(
                    "notice %s of %s in force is unreadable, left out: %s", notice_id, name, exc
                )
                continue
            self._events[(name, notice_id)] = event

    def events(self) -> list[contract.Event]:
        return list(self._events.values())

    def is_scheduled(self, source: str, notice_id: str) -> bool:
        """Whether that notice is in force and still Scheduled (an approval is only sent then)."""
        return any(
            key[1] == notice_id and event.source == source and event.type == contract.SCHEDULED
            for key, event in self._events.items()
        )
