"""The Pub/Sub sink against the official Pub/Sub emulator (real client, real subscriber).

Nothing is mocked: events go through `google-cloud-pubsub` to the emulator and are read
back with a pull subscriber, rebuilt into CloudEvents per the Pub/Sub protocol binding and
validated against the published schema. Failures are real too: the emulator is stopped
(transient) or the topic deleted (permanent).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cloudevents.core.v1.event import CloudEvent

from bridge.config import ConfigError
from bridge.infra.validation import validate
from bridge.pipeline.dispatch import Dispatcher
from bridge.pipeline.events import as_dict, parse, serialize
from bridge.pipeline.spool import NewEvent, Spool
from bridge.sinkapi import Ok, Reject, Retry, Sink
from bridge.transports.pubsub import STRUCTURED_CONTENT_TYPE, fits_attribute_limits
from sinks import pubsub
from tests.factories import fleet_events, instance, per_source, sample_events
from tests.sinks.contract import SinkContract
from tests.support import assert_valid

if TYPE_CHECKING:
    from tests.sinks.pubsub_emulator import Emulator, Topic

pytest_plugins = ["tests.sinks.pubsub_emulator"]

BINARY_KEYS = {
    "ce-specversion",
    "ce-id",
    "ce-source",
    "ce-type",
    "ce-time",
    "ce-subject",
    "ce-dataschema",
    "ce-traceparent",
    "content-type",
}


def rebuild(message: Any) -> CloudEvent:
    """A received message back into a CloudEvent, per the binding (as a consumer would)."""
    attributes = dict(message.attributes)
    content_type = attributes.get("content-type", "")
    if content_type.startswith("application/cloudevents+json"):
        return parse(message.data)
    fields: dict[str, Any] = {k[3:]: v for k, v in attributes.items() if k.startswith("ce-")}
    fields["datacontenttype"] = content_type
    fields["data"] = json.loads(message.data)
    return parse(json.dumps(fields))


def make(topic: str, **options: Any) -> Sink:
    return pubsub.create(pubsub.Config(topic=topic, **options), "pubsub")


# --- configuration and lazy import -------------------------------------------------------


def test_config_defaults_and_topic_validation() -> None:
    def validated(**keys: Any) -> pubsub.Config:
        return validate(pubsub.Config, {"type": "pubsub", **keys})

    config = validated(topic="projects/my-project/topics/maintenance")
    assert (config.mode, config.ordering, config.timeout) == ("binary", True, 30.0)
    assert config.credentials_file is None
    assert config.endpoint is None
    for bad in (
        "maintenance",
        "projects/my-project/topics/",
        "projects/P/topics/maintenance",
        "projects/my-project/subscriptions/maintenance",
        "projects/my-project/topics/googfoo",
    ):
        with pytest.raises(ConfigError, match="topic: must look like projects/"):
            validated(topic=bad)
    with pytest.raises(ConfigError, match="mode: must be one of 'binary', 'structured'"):
        validated(topic="projects/my-project/topics/maint", mode="both")
    with pytest.raises(ConfigError, match="retries: unknown key"):
        validated(topic="projects/my-project/topics/maint", retries=3)


def test_importing_the_sink_does_not_import_the_client_library() -> None:
    code = (
        "import sys\n"
        "from bridge import sink_registry as registry\n"
        "model = registry.config_model('pubsub')\n"
        "from bridge.infra.validation import validate\n"
        "validate(model, {'type': 'pubsub', 'topic': 'projects/my-project/topics/maint'})\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('google.cloud', 'grpc')))\n"
        "print(loaded)\n"
        "assert 'google.cloud.pubsub_v1' not in sys.modules, loaded\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_event_that_exceeds_attribute_limits_falls_back_to_structured() -> None:
    (event,) = sample_events(1)
    attributes = {**event.get_attributes(), "comment": "x" * 2000}
    big = CloudEvent(attributes, event.get_data())
    data, attrs = pubsub.encode(big, "binary")
    assert attrs == {"content-type": STRUCTURED_CONTENT_TYPE}
    assert parse(data).get_extension("comment") == "x" * 2000
    data, attrs = pubsub.encode(event, "binary")
    assert set(attrs) == BINARY_KEYS
    assert fits_attribute_limits({f"k{i}": "v" for i in range(101)}) is not None
    assert fits_attribute_limits({"k" * 257: "v"}) is not None


def test_error_mapping() -> None:
    from google.api_core import exceptions as gexc

    topic = "projects/my-project/topics/maint"
    permanent: list[type[Exception]] = [gexc.NotFound, gexc.PermissionDenied, gexc.InvalidArgument]
    transient: list[type[Exception]] = [
        gexc.DeadlineExceeded,
        gexc.ServiceUnavailable,
        gexc.InternalServerError,
        gexc.Aborted,
        gexc.ResourceExhausted,
        TimeoutError,
    ]
    for cls in permanent:
        assert isinstance(pubsub.classify(cls("x"), topic), Reject), cls
    for cls in transient:
        assert isinstance(pubsub.classify(cls("x"), topic), Retry), cls
    denied = pubsub.classify(gexc.PermissionDenied("no"), topic)  # type: ignore[no-untyped-call]
    missing = pubsub.classify(gexc.NotFound("no"), topic)  # type: ignore[no-untyped-call]
    assert isinstance(denied, Reject)
    assert "roles/pubsub.publisher" in denied.reason
    assert isinstance(missing, Reject)
    assert "does not exist" in missing.reason


# --- the shared contract -------------------------------------------------------------------


class TestPubSubContract(SinkContract):
    @pytest.fixture(autouse=True)
    def _topic(self, pubsub_topic: Topic) -> None:
        self.topic = pubsub_topic

    async def make_sink(self) -> Sink:
        return make(self.topic.topic, timeout=5.0)

    async def received(self) -> list[dict[str, Any]]:
        messages = await asyncio.to_thread(self.topic.drain, 1.5)
        return [assert_valid(rebuild(m)) for m in messages]

    async def make_transient_failure(self) -> None:
        self.topic.emulator.stop()  # the fixture restarts it for the next test

    async def make_permanent_failure(self) -> None:
        self.topic.admin.publisher.delete_topic(topic=self.topic.topic)


# --- through the real client, read back by a real subscriber ------------------------------


@pytest.mark.parametrize("mode", ["binary", "structured"])
async def test_fleet_events_arrive_intact_in_per_vm_order(pubsub_topic: Topic, mode: str) -> None:
    events = fleet_events()
    sink = make(pubsub_topic.topic, mode=mode, timeout=10.0)
    try:
        # One batch with all VMs, then one event at a time: both paths keep per-VM order.
        assert isinstance(await sink.publish(events[:6]), Ok)
        for event in events[6:]:
            assert isinstance(await sink.publish([event]), Ok)
    finally:
        await sink.close(5.0)
    messages = await asyncio.to_thread(pubsub_topic.pull, len(events))
    assert await asyncio.to_thread(pubsub_topic.drain, 0.5) == []

    got = [assert_valid(rebuild(m)) for m in messages]
    assert sorted(json.dumps(e, sort_keys=True) for e in got) == sorted(
        json.dumps(as_dict(e), sort_keys=True) for e in events
    )
    assert per_source(got) == per_source([as_dict(e) for e in events])
    by_id = {e.get_id(): e for e in events}
    for message in messages:
        attributes = dict(message.attributes)
        event = by_id[rebuild(message).get_id()]
        assert message.ordering_key == event.get_source()
        if mode == "binary":
            expected = as_dict(event)
            assert set(attributes) == BINARY_KEYS
            assert attributes["content-type"] == "application/json"
            for name in (
                "specversion", "id", "source", "type", "time", "subject", "dataschema",
                "traceparent",
            ):  # fmt: skip
                assert attributes[f"ce-{name}"] == expected[name]
            assert json.loads(message.data) == expected["data"]
        else:
            assert attributes == {"content-type": STRUCTURED_CONTENT_TYPE}
            assert json.loads(message.data) == as_dict(event)


async def test_oversized_event_is_sent_structured(pubsub_topic: Topic) -> None:
    (event,) = sample_events(1, instance("vm-big"))
    big = CloudEvent({**event.get_attributes(), "comment": "x" * 2000}, event.get_data())
    sink = make(pubsub_topic.topic)
    try:
        assert isinstance(await sink.publish([big]), Ok)
    finally:
        await sink.close(5.0)
    (message,) = await asyncio.to_thread(pubsub_topic.pull, 1)
    assert dict(message.attributes) == {"content-type": STRUCTURED_CONTENT_TYPE}
    assert as_dict(rebuild(message)) == as_dict(big)


async def test_missing_topic_is_reject_and_healthcheck_says_so(pubsub_topic: Topic) -> None:
    missing = pubsub_topic.topic + "-missing"
    sink = make(missing)
    try:
        health = await sink.healthcheck()
        assert not health.ok
        assert "does not exist" in health.detail
        result = await sink.publish(sample_events(2, instance("vm-a")))
        assert isinstance(result, Reject)
        assert "does not exist" in result.reason
        # The ordering key was resumed: once the topic exists, the same key publishes again.
        pubsub_topic.admin.create(missing, pubsub_topic.subscription + "-2")
        assert isinstance(await sink.publish(sample_events(1, instance("vm-a"))), Ok)
    finally:
        await sink.close(5.0)


async def test_healthcheck_ok_and_when_emulator_down(pubsub_topic: Topic) -> None:
    sink = make(pubsub_topic.topic, timeout=3.0)
    try:
        health = await sink.healthcheck()
        assert health.ok, health.detail
        pubsub_topic.emulator.stop()
        health = await sink.healthcheck()
        assert not health.ok
        assert pubsub_topic.topic in health.detail
    finally:
        await sink.close(5.0)


async def test_key_resumes_after_outage(pubsub_topic: Topic) -> None:
    """A failed publish pauses the ordering key in the client; we resume it before Retry."""
    events = sample_events(4, instance("vm-a"))
    sink = make(pubsub_topic.topic, timeout=3.0)
    try:
        assert isinstance(await sink.publish(events[:1]), Ok)
        pubsub_topic.emulator.stop()
        result = await sink.publish(events[1:3])
        assert isinstance(result, Retry), result
        pubsub_topic.emulator.start()
        pubsub_topic.recreate()
        deadline = time.monotonic() + 20
        while not isinstance(result := await sink.publish(events[1:]), Ok):
            assert isinstance(result, Retry), result
            assert time.monotonic() < deadline, result
            await asyncio.sleep(0.2)
    finally:
        await sink.close(5.0)
    messages = await asyncio.to_thread(pubsub_topic.pull, 3)
    assert [rebuild(m).get_id() for m in messages] == [e.get_id() for e in events[1:]]


async def test_outage_through_dispatcher_and_spool_loses_nothing(
    pubsub_topic: Topic, tmp_path: Path
) -> None:
    """Emulator killed mid-run and restarted on the same port: everything arrives, in order.

    The emulator forgets topics on restart, so the test recreates them; the dispatcher's
    backoff sleep is gated until then, or an attempt landing in that instant would see
    NotFound (a Reject, rightly) instead of the outage this test is about.
    """
    emulator: Emulator = pubsub_topic.emulator
    events = fleet_events(per_vm=6)
    before, during = events[:6], events[6:]
    sink = make(pubsub_topic.topic, timeout=2.0)
    spool = Spool(tmp_path, [sink.name])
    await spool.open()
    gate = asyncio.Event()
    gate.set()
    parked = asyncio.Event()

    async def gated_sleep(seconds: float) -> None:
        await asyncio.sleep(seconds)
        if not gate.is_set():
            parked.set()
            await gate.wait()

    dispatcher = Dispatcher(spool, [sink], retry_initial=0.05, retry_max=0.5, sleep=gated_sleep)
    dispatcher.start()

    async def commit(batch: list[CloudEvent]) -> None:
        await spool.commit(
            [NewEvent(e.get_id(), e.get_source(), e.get_type(), serialize(e)) for e in batch]
        )
        dispatcher.notify()

    try:
        await commit(before)
        first = await asyncio.to_thread(pubsub_topic.pull, len(before))
        emulator.stop()
        gate.clear()
        await commit(during)
        await asyncio.wait_for(parked.wait(), 20)
        assert dispatcher.stats[sink.name].retried >= 1
        assert dispatcher.stats[sink.name].delivered == len(before)
        emulator.start()
        pubsub_topic.recreate()
        gate.set()
        rest = await asyncio.to_thread(pubsub_topic.pull, len(during), 30.0)
        extra = await asyncio.to_thread(pubsub_topic.drain, 0.5)
    finally:
        await dispatcher.stop(5.0)
        await spool.close()

    stats = dispatcher.stats[sink.name]
    assert stats.delivered == len(events)
    assert stats.dead_lettered == 0
    got = [assert_valid(rebuild(m)) for m in [*first, *rest, *extra]]
    # At-least-once: a batch may be re-sent after a partial failure, never lost or reordered.
    unique_ids = list(dict.fromkeys(e["id"] for e in got))
    assert sorted(unique_ids) == sorted(e.get_id() for e in events)
    first_seen = [json.loads(s) for s in dict.fromkeys(json.dumps(e) for e in got)]
    assert per_source(first_seen) == per_source([as_dict(e) for e in events])
