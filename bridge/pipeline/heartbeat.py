"""Heartbeats: the sidecar tells the fleet it is alive and watching.

A VM whose sidecar died is a VM whose maintenance nobody will hear about, and silence looks
exactly like "no maintenance". So the sidecar sends `io.maintenancebridge.agent.heartbeat`
once its watcher knows the VM's identity, then every `[heartbeat] interval` seconds (default
300; 0 sends none), with its version, the watcher's health and the spool's depth. A consumer
(the fleet service) that hears nothing for a few intervals marks the VM silent.

Heartbeats take the same road as the notices: committed to the spool, then delivered by the
dispatcher to every sink, at least once. They never block a notice: a beat the spool cannot
take (disk full) is logged and skipped, the next one comes an interval later. Each beat has
its own id (the source, the process start and a counter), so a retried delivery is
de-duplicated like any other event.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from bridge import contract
from bridge.infra.buildinfo import version
from bridge.pipeline.events import instance_data, trace_context
from bridge.pipeline.model import Instance
from bridge.pipeline.spool import NewEvent, SpoolError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from bridge.pipeline.spool import Spool
    from bridge.pipeline.watchers.base import Watcher

log = logging.getLogger("bridge.heartbeat")

# Not the notices' nor the audit events' namespace: a heartbeat id never collides with them.
_HEARTBEAT_NAMESPACE: Final = uuid.UUID("5b2e9d47-1c6a-4f83-b0d2-7e4a9c3f1a68")
#: How often to look whether the watcher has identified the VM yet, seconds.
_IDENTITY_POLL: Final = 0.2


def heartbeat_event(
    instance: Instance,
    *,
    sequence: int,
    started_at: datetime,
    interval: float,
    watcher_healthy: bool,
    spool_depth: int,
    at: datetime,
) -> contract.Event:
    """The `sequence`-th heartbeat of the sidecar process that started at `started_at`; the
    heartbeats of one process share a trace (`traceparent`), one span each."""
    started = contract.rfc3339(started_at)
    id_ = str(uuid.uuid5(_HEARTBEAT_NAMESPACE, f"{instance.source}\n{started}\n{sequence}"))
    return contract.Event(
        id=id_,
        source=instance.source,
        type=contract.HEARTBEAT,
        subject=instance.name,
        time=at.astimezone(UTC),
        traceparent=trace_context(f"{instance.source}\n{started}", id_),
        data=contract.HeartbeatData(
            provider=instance.provider.value,
            instance=instance_data(instance),
            agent_version=version(),
            interval_seconds=interval,
            started_at=started_at.astimezone(UTC),
            watcher_healthy=watcher_healthy,
            spool_depth=spool_depth,
        ),
    )


class Heartbeats:
    """Sends the heartbeats of one running bridge until cancelled: into `spool`, one per
    watcher of `watchers` once it has identified its VM in `instances` (both live maps the
    runner keeps; read here, never written)."""

    def __init__(
        self,
        spool: Spool,
        instances: Mapping[str, Instance],
        watchers: Mapping[str, Watcher],
        interval: float,
    ) -> None:
        self._spool = spool
        self._instances = instances
        self._watchers = watchers
        self._interval = interval
        self._started_at = datetime.now(UTC)
        self.sent = 0

    async def run(self) -> None:
        if self._interval <= 0:
            return
        while True:
            delay = _IDENTITY_POLL  # until the watcher has identified the VM
            if self._instances:
                try:
                    await self.beat()
                except Exception:  # a heartbeat never takes the bridge (or the next one) down
                    log.exception("cannot send the heartbeat; the next in %gs", self._interval)
                delay = self._interval
            await asyncio.sleep(delay)

    async def beat(self) -> None:
        """Spool one heartbeat per watching provider (the commit wakes the dispatcher)."""
        try:
            depth = max((count for count, _ in (await self._spool.depth()).values()), default=0)
            rows = []
            for name, instance in sorted(self._instances.items()):
                watcher = self._watchers.get(name)
                event = heartbeat_event(
                    instance,
                    sequence=self.sent,
                    started_at=self._started_at,
                    interval=self._interval,
                    watcher_healthy=bool(watcher and watcher.healthy),
                    spool_depth=depth,
                    at=datetime.now(UTC),
                )
                rows.append(NewEvent(event.id, event.source, event.type, contract.encode(event)))
            await self._spool.commit(rows)
        except SpoolError as exc:
            log.error("cannot spool the heartbeat, skipping it: %s", exc)
            return
        finally:
            self.sent += 1
