"""Instance identity over the buses: the sidecar's credential travels as the message
attribute `bridgecredential` (Pub/Sub attribute, AMQP application property, Kafka header) and
the fleet's bus source screens it as the http source screens its header.

Real parts: a real `maintenance-bridge fleet` process (its `POST /v1/enroll` and its bus
source), the simulator's signed GCE identity token, the real sinks and client libraries
against the Pub/Sub emulator, the AMQP Event Hubs test server and librdkafka's mock cluster
(skipped without them, failing under CI=true). A bus cannot answer 401/403: refused messages
are kept in `rejected` with the reason and counted, and the stream goes on.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from bridge import sink_registry
from bridge.infra.encoding import parse
from bridge.simulator import Simulator
from bridge.sinkapi import Ok, Sink, validate
from tests.fleet.buses import Bus, toml_table
from tests.fleet.factories import heartbeat
from tests.fleet.test_end_to_end import FleetProcess
from tests.support import eventually
from tests.test_crash import Process

from .documents import enrollment as enrollment_request
from .fleets import NOW, heartbeats, sidecar_toml, start, vm_of

pytest_plugins = ["tests.fleet.bus_fixture"]  # the `bus` fixture
pytestmark = pytest.mark.slow


async def start_fleet(sim: Simulator, folder: Path, bus: Bus, mode: str) -> FleetProcess:
    """A fleet whose only source is the bus's, with `identity = mode`."""
    return await start(
        sim, folder, source=toml_table("[[fleet.sources]]", {**bus.source, "identity": mode})
    )


class Held:
    """The sidecar's `CredentialSource` holding one credential (a test double: the real
    enrollment, `bridge.pipeline.enrollment`, is what the sidecar process test runs)."""

    def __init__(self, credential: str) -> None:
        self.token = credential

    async def credential(self) -> str:
        return self.token

    def invalidate(self) -> None:
        raise AssertionError("a bus sink never sees a refusal")


async def publish(bus: Bus, credential: str | None, mode: str, *bodies: bytes) -> None:
    """`bodies` sent by the bus's real sink in content `mode`, carrying `credential`
    (None: no identity)."""
    keys = {**bus.sink, "mode": mode}
    config = validate(sink_registry.config_model(bus.sink["type"]), keys)
    sink: Sink = sink_registry.create(config, "bus")
    if credential is not None and hasattr(sink, "enrollment"):
        sink.enrollment = Held(credential)
    try:
        assert await sink.publish([parse(body) for body in bodies]) == Ok()
    finally:
        await sink.close(10)


async def rejected(fleet: httpx.AsyncClient, count: int) -> list[str]:
    """The reasons of the rejected table, once it holds `count` rows."""

    async def rows() -> bool:
        held: int = (await fleet.get("/v1/fleet/rejected")).json()["count"]
        return held >= count

    await eventually(rows, timeout=30)
    answer = (await fleet.get("/v1/fleet/rejected")).json()
    return sorted(row["reason"] for row in answer["rejected"])


async def test_an_enrolled_sidecar_s_events_cross_the_bus_into_a_fleet_requiring_identity(
    sim: Simulator, bus: Bus, tmp_path: Path
) -> None:
    fleet = await start_fleet(sim, tmp_path, bus, "required")
    sink = toml_table("[[sinks]]", bus.sink)
    sidecar = Process(sidecar_toml(tmp_path / "gce", sim, "gce", fleet.url, sink=sink))
    try:
        await sidecar.start()

        async def delivered() -> bool:
            return len(await heartbeats(fleet.url)) >= 2

        await eventually(delivered, timeout=60)
        await sidecar.stop()
        async with httpx.AsyncClient(base_url=fleet.url, timeout=10) as http:
            assert (await http.get("/v1/fleet/rejected")).json()["count"] == 0
            metrics = (await http.get("/metrics")).text
            events = (await http.get("/v1/fleet/events?limit=500")).text
    finally:
        await sidecar.stop()
        await fleet.stop()
    name = bus.source["type"]
    assert f'fleet_identity_events_total{{source="{name}",outcome="attested"}}' in metrics
    assert "bridgecredential" not in events  # transport metadata, never part of the event


async def test_on_a_bus_a_credential_speaks_only_for_its_own_vm(
    sim: Simulator, bus: Bus, tmp_path: Path
) -> None:
    process = await start_fleet(sim, tmp_path, bus, "required")
    try:
        async with httpx.AsyncClient(base_url=process.url, timeout=10) as fleet:
            async with httpx.AsyncClient(timeout=10) as metadata:
                request = await enrollment_request(sim, metadata, "gce_iit")
            enrolled = await fleet.post("/v1/enroll", json=request)
            assert enrolled.status_code == 200, enrolled.text
            credential = enrolled.json()["credential"]
            own = vm_of(sim, "gce")
            other = replace(own, id="another-id", name="vm-b", source=own.source + "-b")

            # the attribute travels in both content modes
            await publish(bus, credential, "structured", heartbeat(own, NOW))
            await publish(bus, credential, "binary", heartbeat(other, NOW))
            await publish(bus, None, "binary", heartbeat(own, NOW, sequence=1))

            reasons = await rejected(fleet, 2)
            assert len(reasons) == 2, reasons
            assert reasons[0].startswith("identity: event source")
            assert "is not the enrolled instance" in reasons[0]
            assert reasons[1].startswith("identity: no credential")

            async def stored() -> bool:
                return await heartbeats(process.url) == [own.source]

            await eventually(stored, timeout=30)
            metrics = (await fleet.get("/metrics")).text
    finally:
        await process.stop()
    name = bus.source["type"]
    for outcome in ("attested", "refused_binding", "refused_credential"):
        line = f'fleet_identity_events_total{{source="{name}",outcome="{outcome}"}} 1'
        assert line in metrics, metrics


async def test_optional_identity_takes_a_message_without_the_attribute_as_unattested(
    sim: Simulator, bus: Bus, tmp_path: Path
) -> None:
    process = await start_fleet(sim, tmp_path, bus, "optional")
    own = vm_of(sim, "gce")
    try:
        async with httpx.AsyncClient(base_url=process.url, timeout=10) as fleet:
            await publish(bus, None, "structured", heartbeat(own, NOW))

            async def stored() -> bool:
                return await heartbeats(process.url) == [own.source]

            await eventually(stored, timeout=30)
            (row,) = (await fleet.get("/v1/fleet/identity")).json()["instances"]
            metrics = (await fleet.get("/metrics")).text
            assert (await fleet.get("/v1/fleet/rejected")).json()["count"] == 0
    finally:
        await process.stop()
    assert row["source"] == own.source
    assert row["last_event_attested"] is False
    name = bus.source["type"]
    assert f'fleet_identity_events_total{{source="{name}",outcome="unattested"}} 1' in metrics
