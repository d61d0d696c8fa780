"""The `pubsub` source against Google's Pub/Sub emulator: the sidecars' real Pub/Sub sink
publishes, the fleet service's streaming pull consumes into its store.

Acknowledgements are checked the way Pub/Sub shows them: after the fleet service stopped,
a plain pull on the subscription gets nothing back (everything was acked) or gets back
exactly what the service had not committed. The emulator comes from
tests/sinks/pubsub_emulator.py (skipped without it, failing under CI=true).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest
from cloudevents.core.v1.event import CloudEvent

from bridge.fleet.config import parse_fleet_config
from bridge.fleet.service import FleetService
from bridge.fleet.store import EventQuery, NoticeFilter
from bridge.pipeline.events import parse
from bridge.pipeline.model import Status
from bridge.sinkapi import Ok
from sinks import pubsub
from tests.fleet.factories import T0, azure_vm, gce_vm, heartbeat, transition
from tests.fleet.outage import FailingStore
from tests.support import eventually

if TYPE_CHECKING:
    from tests.sinks.pubsub_emulator import Topic

pytest_plugins = ["tests.sinks.pubsub_emulator"]

VMS = [gce_vm("web-1"), azure_vm("db-1"), azure_vm("db-2", scale_set="db-set")]


def stream(offset: int = 0) -> list[bytes]:
    """Per VM: a heartbeat and a notice scheduled then started."""
    bodies = []
    for vm in VMS:
        notice = f"{vm.name}-n{offset}"
        bodies.append(heartbeat(vm, T0, sequence=offset))
        bodies.append(transition(vm, notice, Status.SCHEDULED, T0, not_before=T0))
        bodies.append(transition(vm, notice, Status.STARTED, T0))
    return bodies


def source(topic: Topic, **more: Any) -> dict[str, Any]:
    return {
        "type": "pubsub",
        "subscription": topic.subscription,
        "batch_wait": 0.02,
        "retry_initial": 0.05,
        "retry_max": 0.2,
        **more,
    }


def service_for(tmp_path: Path, topic: Topic, store: FailingStore | None = None) -> FleetService:
    raw = {
        "fleet": {
            "listener": {"port": 0},
            "store": {"url": f"sqlite://{tmp_path / 'fleet.sqlite3'}"},
            "sources": [source(topic)],
        }
    }
    return FleetService(parse_fleet_config(raw), store=store)


async def publish(
    topic: Topic, bodies: list[bytes], mode: Literal["binary", "structured"] = "binary"
) -> None:
    """Through the sidecars' own Pub/Sub sink."""
    sink = pubsub.create(pubsub.Config(topic=topic.topic, mode=mode, timeout=10.0), "pubsub")
    try:
        events: list[CloudEvent] = [parse(body) for body in bodies]
        assert isinstance(await sink.publish(events), Ok)
    finally:
        await sink.close(5.0)


async def events_stored(service: FleetService, count: int) -> None:
    async def reached() -> bool:
        return (await service.store.counts())["events"] >= count

    await eventually(reached, timeout=30)


async def test_both_content_modes_are_committed_then_acknowledged(
    tmp_path: Path, pubsub_topic: Topic
) -> None:
    first, second = stream(0), stream(1)
    service = service_for(tmp_path, pubsub_topic)
    async with service.running():
        await publish(pubsub_topic, first, mode="binary")
        await publish(pubsub_topic, second, mode="structured")
        await events_stored(service, len(first + second))
        notices = await service.store.notices(NoticeFilter())
        assert sorted((n["instance"], n["status"]) for n in notices) == sorted(
            [(vm.name, "started") for vm in VMS] * 2
        )
        assert service.stats.counts[("pubsub", "accepted")] == len(first + second)
        health = service.sources[0].health()
        assert health.ok, health.detail
        # Either mode, the audit log holds the event the sidecar published.
        page = await service.store.events(EventQuery())
        stored = {json.loads(row[3])["id"]: json.loads(row[3]) for row in page.rows}
        assert stored == {json.loads(body)["id"]: json.loads(body) for body in first + second}
    assert await asyncio.to_thread(pubsub_topic.drain, 2.0) == []


async def test_a_redelivered_message_is_a_duplicate(tmp_path: Path, pubsub_topic: Topic) -> None:
    body = stream()[1]
    service = service_for(tmp_path, pubsub_topic)
    async with service.running():
        await publish(pubsub_topic, [body])
        await publish(pubsub_topic, [body])  # the sink retried a publish that had landed

        await eventually(lambda: service.stats.counts[("pubsub", "duplicate")] == 1, timeout=30)
        assert (await service.store.counts())["events"] == 1


async def test_bad_messages_are_rejected_acknowledged_and_the_stream_goes_on(
    tmp_path: Path, pubsub_topic: Topic
) -> None:
    from google.cloud import pubsub_v1  # type: ignore[import-untyped]

    good = stream()[1]
    unknown = json.loads(good)
    unknown["type"] = "com.example.unknown"
    unknown["id"] = "unknown-1"
    publisher = pubsub_v1.PublisherClient()
    for data in (b"{not json", json.dumps(unknown).encode()):
        await asyncio.to_thread(publisher.publish(pubsub_topic.topic, data).result, 10)
    publisher.stop()
    service = service_for(tmp_path, pubsub_topic)
    async with service.running():
        await publish(pubsub_topic, [good])
        await events_stored(service, 1)
        await eventually(lambda: service.stats.counts[("pubsub", "invalid")] == 2, timeout=30)
        reasons = sorted(r["reason"] for r in await service.store.rejected())
        assert len(reasons) == 2
        assert any("com.example.unknown" in reason for reason in reasons), reasons
    assert await asyncio.to_thread(pubsub_topic.drain, 2.0) == []


def unordered(topic: Topic) -> Topic:
    """A second subscription on `topic`, without message ordering: the fleet needs none (its
    store keeps the newest state whatever the order), and only without it does Pub/Sub
    redeliver a released message at once rather than after its key's other leases expire."""
    name = topic.subscription + "-unordered"
    topic.admin.subscriber.create_subscription(request={"name": name, "topic": topic.topic})
    return dataclasses.replace(topic, subscription=name)


async def test_nothing_is_acknowledged_before_the_store_commits(
    tmp_path: Path, pubsub_topic: Topic
) -> None:
    topic = unordered(pubsub_topic)
    bodies = stream()
    store = FailingStore(tmp_path / "fleet.sqlite3")
    service = service_for(tmp_path, topic, store=store)
    async with service.running():
        await publish(topic, bodies)
        await eventually(lambda: store.attempts >= 3, timeout=30)
        health = service.sources[0].health()
        assert not health.ok
        assert "simulated outage" in health.detail
    # Stopped mid-outage: nothing was acked, so every message comes back to the
    # subscription (those the client library still held once their 10 s lease lapses).
    again = await asyncio.to_thread(topic.pull, len(bodies), 60.0)
    assert sorted(m.message_id for m in again) == sorted(set(m.message_id for m in again))
    assert len(again) == len(bodies)


async def test_the_store_coming_back_commits_the_held_batch(
    tmp_path: Path, pubsub_topic: Topic
) -> None:
    bodies = stream()
    store = FailingStore(tmp_path / "fleet.sqlite3")
    service = service_for(tmp_path, pubsub_topic, store=store)
    async with service.running():
        await publish(pubsub_topic, bodies)
        await eventually(lambda: store.attempts >= 2, timeout=30)
        store.failing = False
        await events_stored(service, len(bodies))
        await eventually(lambda: service.sources[0].health().ok, timeout=10)
        assert (await service.store.counts())["events"] == len(bodies)
    assert await asyncio.to_thread(pubsub_topic.drain, 2.0) == []


def test_a_subscription_must_be_a_full_path() -> None:
    from bridge.infra.validation import ConfigError

    with pytest.raises(ConfigError, match="subscription"):
        parse_fleet_config({"fleet": {"sources": [{"type": "pubsub", "subscription": "s"}]}})


async def test_events_out_of_the_stores_bounds_are_rejected_and_acknowledged(
    tmp_path: Path, pubsub_topic: Topic
) -> None:
    """Issue #29: each out-of-bounds event is one rejected message, acknowledged."""
    from datetime import UTC, datetime

    from google.cloud import pubsub_v1

    from tests.fleet.poison import nested, poison

    bad = [*poison(datetime.now(UTC)).values(), nested(100_000)]
    publisher = pubsub_v1.PublisherClient()
    for data in bad:
        await asyncio.to_thread(publisher.publish(pubsub_topic.topic, data).result, 10)
    publisher.stop()
    good = stream()[1]
    service = service_for(tmp_path, pubsub_topic)
    async with service.running():
        await publish(pubsub_topic, [good])
        await events_stored(service, 1)
        await eventually(
            lambda: service.stats.counts[("pubsub", "invalid")] == len(bad), timeout=30
        )
        assert (await service.store.counts())["rejected"] == len(bad)
    assert await asyncio.to_thread(pubsub_topic.drain, 2.0) == []
