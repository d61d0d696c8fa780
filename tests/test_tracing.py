"""OpenTelemetry export (bridge/infra/tracing.py): one maintenance followed from the sidecar's
poll to the fleet's commit in one trace, received by a real OTLP/HTTP receiver.

The receiver is an HTTP server this test starts on loopback; it decodes each export with the
OTLP protobuf messages (`opentelemetry-proto`, which the exporter of the `otel` extra depends
on), as a collector would. The sidecar and the fleet are real `maintenance-bridge` processes
watching a simulated GCE VM. Without the extra the tests skip on a laptop and fail under
`CI=true` (`make install` installs it).
"""

from __future__ import annotations

import asyncio
import gzip
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from bridge.config import ConfigError, parse_config
from bridge.fleet.config import parse_fleet_config
from bridge.infra import tracing
from bridge.infra.tracing import TracingSettings
from bridge.infra.validation import validate
from bridge.simulator import Simulator
from tests.fleet.test_end_to_end import (
    KEY,
    FleetProcess,
    audit_log,
    fleet_config,
    sidecar_config,
)
from tests.support import eventually, free_port
from tests.test_crash import ROOT, Process


def _need_otel() -> None:
    try:
        import opentelemetry.proto.collector.trace.v1.trace_service_pb2
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        message = "the otel extra is needed: pip install -e '.[otel]' (make install does)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    parent_id: str
    event_id: str
    attributes: dict[str, Any]


class Receiver:
    """An OTLP/HTTP traces receiver on loopback: POST /v1/traces, protobuf bodies."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.headers: list[dict[str, str]] = []
        self.url = ""

    async def _export(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        assert request.content_type == "application/x-protobuf"
        body = await request.read()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        self.headers.append(dict(request.headers))
        for resource_spans in export.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {a.key: _value(a.value) for a in span.attributes}
                    self.spans.append(
                        Span(
                            service=resource["service.name"],
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            event_id=str(attributes.get("cloudevents.event_id", "")),
                            attributes=attributes,
                        )
                    )
        answer = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1/traces"
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._runner.cleanup()


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    _need_otel()
    async with Receiver() as running:
        yield running


def tracing_table(table: str, endpoint: str) -> str:
    return (
        f'\n[{table}]\nendpoint = "{endpoint}"\nsampling_ratio = 1.0\ntimeout = 5\n'
        f'headers = {{ authorization = "env:OTLP_TEST_TOKEN" }}\n'
    )


@pytest.mark.slow
async def test_one_event_from_sidecar_poll_to_fleet_commit_is_one_trace(
    receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTLP_TEST_TOKEN", "Bearer collector-token-1234")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # the SDK's export interval, ms
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    fleet_toml = fleet_config(tmp_path, port, tracing_table("fleet.tracing", receiver.url))
    fleet = FleetProcess(fleet_toml, url)
    async with (
        Simulator("gce", identity={"gce": {"instance_name": "web-1"}}) as gce,
        httpx.AsyncClient(base_url=url) as http,
    ):
        config = sidecar_config(
            tmp_path / "web-1", "gce", {"metadata_url": gce.gce_url}, f"{url}/v1/events", "binary"
        )
        config.write_text(config.read_text() + tracing_table("tracing", receiver.url))
        sidecar = Process(config)
        await fleet.start()
        try:
            await sidecar.start()
            gce.gce.set(KEY, "MIGRATE_ON_HOST_MAINTENANCE")

            async def started() -> list[dict[str, Any]]:
                return [
                    e for e in await audit_log(http) if e["type"].endswith("maintenance.started")
                ]

            await eventually(started, 30)
            (event,) = await started()
            trace_id, parent_id = event["traceparent"].split("-")[1:3]

            def names() -> set[tuple[str, str]]:
                return {(s.service, s.name) for s in receiver.spans if s.event_id == event["id"]}

            await eventually(lambda: len(names()) == 5, 30)
        finally:
            await sidecar.stop()
            await fleet.stop()

    spans = [s for s in receiver.spans if s.event_id == event["id"]]
    assert names() == {
        ("maintenance-bridge", "poll"),
        ("maintenance-bridge", "spool"),
        ("maintenance-bridge", "deliver"),
        ("maintenance-fleet", "ingest"),
        ("maintenance-fleet", "commit"),
    }
    # One trace, each span a child of the event's own span: the fleet joined the sidecar's
    # trace through the event alone.
    assert {s.trace_id for s in spans} == {trace_id}
    assert {s.parent_id for s in spans} == {parent_id}
    (deliver,) = [s for s in spans if s.name == "deliver"]
    assert deliver.attributes["maintenance_bridge.sink"] == "fleet"
    assert deliver.attributes["maintenance_bridge.outcome"] == "Ok"
    (poll,) = [s for s in spans if s.name == "poll"]
    assert poll.attributes["maintenance_bridge.watcher"] == "gce"
    # The configured headers reach the collector (from the environment, as secrets).
    assert all(h.get("Authorization") == "Bearer collector-token-1234" for h in receiver.headers)


def test_the_sdk_is_loaded_only_when_tracing_is_configured(tmp_path: Path) -> None:
    """Start-up cost: building the programs with a configuration that has no tracing imports
    none of OpenTelemetry; configuring it does."""
    _need_otel()
    script = """
import sys
from bridge import runner
from bridge.fleet import service
from bridge.config import parse_config
from bridge.infra import tracing
loaded = lambda: sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
config = parse_config({"tracing": {"endpoint": "http://127.0.0.1:9/v1/traces"}})
assert not tracing.configure(None, "0"), "nothing configured"
tracing.record("poll", iter(()), 0.0)
assert loaded() == [], loaded()
assert tracing.configure(config.tracing, "0")
assert "opentelemetry.sdk.trace" in loaded()
tracing.shutdown(timeout=0.1)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_without_the_extra_a_configured_program_runs_untraced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A missing observability package must not stop delivery: one warning naming the extra."""
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    settings = validate(TracingSettings, {"endpoint": "http://127.0.0.1:9/v1/traces"})
    assert tracing.configure(settings, "0") is False
    assert "pip install 'maintenance-bridge[otel]'" in caplog.text

    def never() -> Iterator[tuple[str | None, str]]:
        raise AssertionError("the events are not even looked at")
        yield  # pragma: no cover

    tracing.record("deliver", never(), 0.0)


def test_sampling_keeps_the_ratio_of_maintenances_alike_in_every_process() -> None:
    """The contract's trace ids are UUIDv5s (their low 64 bits all begin with the variant
    bits), so the SDK's own ratio sampler would keep every trace or none; ours hashes the id."""
    _need_otel()
    import uuid

    from bridge.infra.tracing import _ratio_sampler

    half, again = _ratio_sampler(0.5), _ratio_sampler(0.5)
    ids = [uuid.uuid5(uuid.NAMESPACE_URL, str(n)).int for n in range(2000)]
    kept = [half.should_sample(None, i, "poll").decision.is_sampled() for i in ids]
    assert 0.45 < sum(kept) / len(ids) < 0.55
    assert kept == [again.should_sample(None, i, "commit").decision.is_sampled() for i in ids]
    assert not any(
        _ratio_sampler(0.0).should_sample(None, i, "x").decision.is_sampled() for i in ids
    )
    assert all(_ratio_sampler(1.0).should_sample(None, i, "x").decision.is_sampled() for i in ids)


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ({}, "tracing.endpoint: required"),
        (
            {"endpoint": "grpc://collector:4317"},
            "tracing.endpoint: must be an http:// or https:// URL",
        ),
        ({"sampling_ratio": 1.5}, "tracing.sampling_ratio: must be <= 1"),
        ({"headers": {"x key": "v"}}, "tracing.headers: 'x key' is not a valid HTTP header name"),
        ({"headers": {"x-key": "env:OTLP_UNSET_VAR"}}, "tracing.headers.x-key: environment"),
        ({"service_name": " "}, "tracing.service_name: must not be empty"),
        ({"exporter": "grpc"}, "tracing.exporter: unknown key"),
    ],
)
def test_a_bad_tracing_table_is_refused_with_its_key(table: dict[str, Any], problem: str) -> None:
    base = {"endpoint": "http://127.0.0.1:4318/v1/traces"} if table else {}
    with pytest.raises(ConfigError) as raised:
        parse_config({"tracing": {**base, **table}})
    assert any(problem in line for line in raised.value.problems), raised.value.problems
    with pytest.raises(ConfigError) as raised:
        parse_fleet_config({"fleet": {"tracing": {**base, **table}}})
    assert any(f"fleet.{problem}" in line for line in raised.value.problems)


def test_each_program_names_itself_and_hides_the_headers() -> None:
    sidecar = parse_config({"tracing": {"endpoint": "https://otel.example/v1/traces"}}).tracing
    fleet = parse_fleet_config(
        {
            "fleet": {
                "tracing": {"endpoint": "https://otel.example/v1/traces", "headers": {"a": "s3"}}
            }
        }
    ).tracing
    assert sidecar is not None
    assert fleet is not None
    assert (sidecar.service_name, fleet.service_name) == ("maintenance-bridge", "maintenance-fleet")
    assert "s3" not in repr(fleet)


def _configmap(path: Path, key: str) -> str:
    import yaml

    text: str = yaml.safe_load(path.read_text())["data"][key]
    return text


EXAMPLES = {
    "deploy/fleet/fleet-sqlite.toml": lambda: (ROOT / "deploy/fleet/fleet-sqlite.toml").read_text(),
    "deploy/fleet/fleet-postgres.toml": lambda: (
        ROOT / "deploy/fleet/fleet-postgres.toml"
    ).read_text(),
    "deploy/kubernetes/fleet/configmap.yaml": lambda: _configmap(
        ROOT / "deploy/kubernetes/fleet/configmap.yaml", "fleet.toml"
    ),
    "deploy/kubernetes/configmap.yaml": lambda: _configmap(
        ROOT / "deploy/kubernetes/configmap.yaml", "config.toml"
    ),
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_examples_show_every_tracing_key_ready_to_uncomment(
    example: str, tmp_path: Path
) -> None:
    """Tracing is optional (the extra, a collector), so the examples show its table commented
    out, every key written; uncommented (its header file in place) it is valid."""
    text = EXAMPLES[example]()
    fleet = "fleet." if "fleet" in example else ""
    start = text.index(f"\n# [{fleet}tracing]\n")
    block = text[start:].splitlines()
    keys = [line[2:].partition(" = ")[0] for line in block if re.match(r"# \w+ = ", line)]
    assert keys == list(TracingSettings.__struct_fields__)
    uncommented = "\n".join(line[2:] for line in block if re.match(r"# (\[|\w+ = )", line))
    header = tmp_path / "otlp-authorization"
    header.write_text("Bearer example\n")
    uncommented = re.sub(r'"(file|env):[^"]+"', f'"file:{header}"', uncommented)
    raw = tomllib.loads(uncommented)
    if fleet:
        settings: TracingSettings | None = parse_fleet_config(raw).tracing
    else:
        settings = parse_config(raw).tracing
    assert settings is not None
    assert settings.headers["authorization"].get_secret_value() == "Bearer example"


async def test_only_events_with_a_valid_traceparent_get_spans(receiver: Receiver) -> None:
    """In process, against the same receiver: a span per event that names its parent, none
    for an event without one (spooled before the extension) or with a malformed one."""
    import time

    settings = validate(TracingSettings, {"endpoint": receiver.url, "service_name": "unit"})
    parent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    assert tracing.configure(settings, "0")
    try:
        events = [(parent, "e-1"), (None, "e-2"), ("00-zz-bad-01", "e-3"), (parent, "e-4")]
        tracing.record("deliver", events, time.time() - 1, {"maintenance_bridge.sink": "s"})
    finally:
        await asyncio.to_thread(tracing.shutdown)
    assert sorted(s.event_id for s in receiver.spans) == ["e-1", "e-4"]
    assert {(s.trace_id, s.parent_id, s.service) for s in receiver.spans} == {
        ("ab" * 16, "cd" * 8, "unit")
    }
