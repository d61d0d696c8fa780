"""A refused ingest request leaves one fleet log line with the request id, the ingest source
and the instance, so the sidecar's line about the same post finds it (and back).

Real parts: the fleet service on its listener, the real webhook sink posting to it, and
plain HTTP posts for the refusals a sink would not send.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx
import pytest
from aiohttp.test_utils import make_mocked_request

from bridge.fleet.ingest_log import BODY, MESSAGES_LOGGED, about, refused_messages
from bridge.fleet.store import Refused
from bridge.pipeline.events import parse, serialize, to_cloudevent
from bridge.pipeline.model import Status
from bridge.sinkapi import Ok
from tests.factories import sample_notices
from tests.fleet.conftest import SECRET, FleetFactory
from tests.fleet.factories import T0, gce_vm, transition
from tests.fleet.test_http_source import sink
from tests.support import eventually

OTHER_SECRET = "whsec_" + "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXkwMQ=="


def refused_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "bridge.fleet.ingest"]


def invalid(name: str, notice: str = "n-1") -> bytes:
    """An event the contract refuses: its type says started, its data scheduled."""
    event = json.loads(transition(gce_vm(name), notice, Status.SCHEDULED, T0))
    event["type"] = event["type"].replace("scheduled", "started")
    return json.dumps(event).encode()


async def test_a_post_refused_for_its_signature_is_logged_with_the_sidecars_event_id(
    fleet_service: FleetFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "bridge.fleet.ingest")
    body = transition(gce_vm("web-9"), "n-1", Status.SCHEDULED, T0)
    event, attributes = parse(body), json.loads(body)
    async with fleet_service([{"type": "http", "name": "sidecars", "secrets": [SECRET]}]) as svc:
        client = sink(svc.url, "binary", [OTHER_SECRET])
        try:
            result = await client.publish([event])
        finally:
            await client.close(1.0)
    assert not isinstance(result, Ok)
    (line,) = refused_lines(caplog)
    fields = vars(line)
    # The webhook sink's webhook-id of one event is the event id the sidecar logs.
    assert fields["request_id"] == attributes["id"]
    assert fields["ingest"] == "sidecars"
    assert fields["instance"] == attributes["source"]
    assert fields["status"] == 401
    assert attributes["id"] in line.getMessage()


async def test_refused_events_are_logged_with_their_instances_and_reason(
    fleet_service: FleetFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "bridge.fleet.ingest")
    batch = b"[" + b",".join(invalid(f"vm-{i}") for i in range(5)) + b"]"
    async with fleet_service() as svc, httpx.AsyncClient(base_url=svc.url) as http:
        one = await http.post(
            "/v1/events",
            content=invalid("web-1"),
            headers={"content-type": "application/cloudevents+json", "x-request-id": "req-42"},
        )
        many = await http.post(
            "/v1/events",
            content=batch,
            headers={"content-type": "application/cloudevents-batch+json"},
        )
        fine = await http.post(
            "/v1/events",
            content=transition(gce_vm("web-2"), "n-2", Status.SCHEDULED, T0),
            headers={"content-type": "application/cloudevents+json"},
        )
    assert (one.status_code, many.status_code, fine.status_code) == (400, 400, 200)
    first, second = (vars(line) for line in refused_lines(caplog))  # none for the accepted
    source = json.loads(invalid("web-1"))["source"]
    assert (first["request_id"], first["ingest"], first["instance"]) == ("req-42", "http", source)
    assert first["reason"].startswith("refused: ")
    assert second["request_id"] == "-"
    assert second["instance"].endswith(" and 2 more")  # five instances, three named
    assert second["instance"].count(",") == 2


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def traced(body: bytes, traceparent: str = TRACEPARENT) -> bytes:
    """`body` with the CloudEvents distributed-tracing extension attribute."""
    return json.dumps({**json.loads(body), "traceparent": traceparent}).encode()


async def test_the_traceparent_is_stored_with_the_event_and_named_in_the_log(
    fleet_service: FleetFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "bridge.fleet.ingest")
    kept = traced(transition(gce_vm("web-3"), "n-3", Status.SCHEDULED, T0))
    structured = {"content-type": "application/cloudevents+json"}
    async with fleet_service() as svc, httpx.AsyncClient(base_url=svc.url) as http:
        assert (await http.post("/v1/events", content=kept, headers=structured)).is_success
        refused = await http.post(
            "/v1/events", content=traced(invalid("web-4")), headers=structured
        )
        forged = await http.post(
            "/v1/events", content=traced(invalid("web-5"), "00-x\nforged"), headers=structured
        )
        (event,) = (await http.get("/v1/fleet/events")).json()  # a CloudEvents batch
    assert (refused.status_code, forged.status_code) == (400, 400)
    assert event["traceparent"] == TRACEPARENT  # kept with the event as received
    first, second = (vars(line) for line in refused_lines(caplog))
    assert first["traceparent"] == TRACEPARENT
    assert TRACEPARENT in caplog.records[0].getMessage()
    assert second["traceparent"] == "-"  # not of the W3C shape: not written to the log


@pytest.mark.parametrize("mode", ["structured", "binary", "batch"])
async def test_a_maintenance_traceparent_travels_from_the_writer_to_the_fleets_audit_log(
    fleet_service: FleetFactory, mode: str
) -> None:
    """The sidecar writes the CloudEvents distributed-tracing extension on each maintenance
    event; the webhook sink carries it in every content mode (binary: `ce-traceparent`) and
    the fleet keeps it with the event."""
    notices = sample_notices(2, gce_vm("web-7"))
    events = [parse(serialize(to_cloudevent(notice))) for notice in notices]
    written = [str(event.get_extension("traceparent")) for event in events]
    async with fleet_service() as svc, httpx.AsyncClient(base_url=svc.url) as http:
        client = sink(svc.url, mode)
        requests = [events] if mode == "batch" else [[event] for event in events]
        try:
            results = [await client.publish(request) for request in requests]
        finally:
            await client.close(1.0)
        assert all(isinstance(result, Ok) for result in results)
        stored = (await http.get("/v1/fleet/events")).json()
    assert [event["traceparent"] for event in stored] == written
    assert len({parent.split("-")[1] for parent in written}) == 1  # one maintenance, one trace


async def test_a_body_nested_past_the_decoders_limit_is_logged_without_its_instances() -> None:
    """The refusal of a body too deep to decode is logged (naming nothing it could not read),
    and the log line never turns the answer into a 500."""
    request = make_mocked_request("POST", "/v1/events")
    request[BODY] = b"[" * 100_000 + b"]" * 100_000
    assert await about(request) == ("-", "-")


async def test_a_message_a_bus_source_refuses_is_logged_with_the_event_id_and_instance(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bus took the sidecar's message, so its sink logged no refusal: the fleet's line
    carries the event id the sidecar logged with its notice, the source and the instance.
    Real parts: librdkafka's mock cluster and the fleet's Kafka source (tests/sinks/kafka_mock)."""
    from tests.fleet.test_kafka_source import produce_raw, service_for, stored
    from tests.sinks.kafka_mock import MockCluster, require_library

    caplog.set_level(logging.WARNING, "bridge.fleet.ingest")
    bad = invalid("web-7")
    attributes = json.loads(bad)
    cluster = MockCluster(require_library())
    cluster.start()
    try:
        topic = cluster.create_topic(partitions=1)
        service = service_for(tmp_path, cluster, topic)
        structured = [("content-type", b"application/cloudevents+json")]
        good = transition(gce_vm("web-8"), "n-2", Status.SCHEDULED, T0)
        async with service.running():
            messages = [(structured, bad), (None, b"not json at all"), (structured, good)]
            await asyncio.to_thread(produce_raw, cluster, topic, messages)
            await stored(service, 1)
            await eventually(lambda: len(refused_lines(caplog)) == 2, timeout=30)
    finally:
        cluster.stop()
    lines = [vars(line) for line in refused_lines(caplog)]
    (first,) = [line for line in lines if line["request_id"] != "-"]
    (second,) = [line for line in lines if line["request_id"] == "-"]
    assert first["request_id"] == attributes["id"]
    assert first["ingest"] == "kafka"
    assert first["instance"] == attributes["source"]
    assert first["traceparent"] == attributes["traceparent"]
    assert first["status"] == "rejected"
    assert "started" in first["reason"]
    assert (second["request_id"], second["instance"]) == ("-", "-")
    assert "CloudEvent" in second["reason"]


def test_a_flood_of_refused_messages_is_logged_ten_lines_and_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "bridge.fleet.ingest")
    refused_messages("pubsub", [Refused(invalid(f"vm-{i}"), "bad") for i in range(25)])
    lines = refused_lines(caplog)
    assert len(lines) == MESSAGES_LOGGED + 1
    assert "15 more message(s)" in lines[-1].getMessage()
