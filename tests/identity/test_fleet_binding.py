"""A real `maintenance-bridge fleet` process with `identity = "required"`: each cloud's
simulated VM enrolls with its signed document and its events are accepted; each attestation
fault is refused at enrollment with its status and reason; a credential of VM A is refused
for events about VM B (403) while A's own go through; no or a bad credential is 401; both
kept in `rejected`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.infra.credential import HEADER
from bridge.pipeline.model import Status
from bridge.simulator import Simulator
from tests.fleet.factories import heartbeat, transition

from .documents import AUDIENCE, source_of
from .documents import enrollment as enrollment_request
from .fleets import NOW, running, vm_of

pytestmark = pytest.mark.slow
STRUCTURED = {"content-type": "application/cloudevents+json"}


@pytest.fixture
async def fleet(sim: Simulator, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        running(sim, tmp_path) as process,
        httpx.AsyncClient(base_url=process.url, timeout=10) as http,
    ):
        yield http


async def enroll(fleet: httpx.AsyncClient, sim: Simulator, method: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as metadata:
        request = await enrollment_request(sim, metadata, method)
    return await fleet.post("/v1/enroll", json=request)


async def post(fleet: httpx.AsyncClient, event: bytes, credential: str | None) -> httpx.Response:
    headers = STRUCTURED | ({HEADER: credential} if credential else {})
    return await fleet.post("/v1/events", content=event, headers=headers)


CLOUD = {"gce_iit": "gce", "azure_msi": "azure", "azure_attested": "azure", "aws_iid": "aws"}


@pytest.mark.parametrize("method", list(CLOUD))
async def test_each_cloud_enrolls_and_only_its_own_events_are_accepted(
    sim: Simulator, fleet: httpx.AsyncClient, method: str
) -> None:
    cloud = CLOUD[method]
    enrolled = await enroll(fleet, sim, method)
    assert enrolled.status_code == 200, enrolled.text
    credential = enrolled.json()["credential"]
    assert len(credential) <= 1024
    own = vm_of(sim, cloud)

    assert (await post(fleet, heartbeat(own, NOW), credential)).status_code == 200

    other = replace(own, id="another-id", name="vm-b", source=own.source + "-b")
    refused = await post(fleet, heartbeat(other, NOW), credential)
    assert refused.status_code == 403
    assert "is not the enrolled instance" in refused.json()["error"]

    missing = await post(fleet, heartbeat(own, NOW, sequence=1), None)
    assert missing.status_code == 401
    assert "no credential" in missing.json()["error"]
    forged = await post(fleet, heartbeat(own, NOW, sequence=2), credential[:-4] + "AAAA")
    assert forged.status_code == 401

    rejected = (await fleet.get("/v1/fleet/rejected")).json()["rejected"]
    reasons = [row["reason"] for row in rejected]
    assert len(reasons) == 3
    assert all(reason.startswith("identity: ") for reason in reasons)

    metrics = (await fleet.get("/metrics")).text
    for outcome, count in (("attested", 1), ("refused_binding", 1), ("refused_credential", 2)):
        line = f'fleet_identity_events_total{{source="http",outcome="{outcome}"}} {count}'
        assert line in metrics, metrics
    assert 'fleet_enrollments_total{outcome="issued"} 1' in metrics


async def test_same_source_another_instance_id_is_refused(
    sim: Simulator, fleet: httpx.AsyncClient
) -> None:
    credential = (await enroll(fleet, sim, "gce_iit")).json()["credential"]
    own = vm_of(sim, "gce")
    answer = await post(fleet, heartbeat(replace(own, id="1"), NOW), credential)
    assert answer.status_code == 403
    assert "instance id '1'" in answer.json()["error"]


async def test_one_request_mixing_the_vms_own_events_and_another_vms(
    sim: Simulator, fleet: httpx.AsyncClient
) -> None:
    """A sidecar of VM A posting, in one batch, its own events and events about VM B (and
    one that is no event at all): A's are stored and marked attested, each of B's is refused
    with its own reason and kept in `rejected`, and the answer is 403 with the counts."""
    credential = (await enroll(fleet, sim, "gce_iit")).json()["credential"]
    own = vm_of(sim, "gce")
    elsewhere = replace(own, id="another-id", name="vm-b", source=own.source + "-b")
    renamed = replace(own, id="1")  # A's source, B's instance id
    bodies = [
        heartbeat(own, NOW),
        heartbeat(elsewhere, NOW),
        b'{"not": "an event"}',
        transition(own, "n-1", Status.SCHEDULED, NOW),
        heartbeat(renamed, NOW, sequence=1),
    ]
    answer = await fleet.post(
        "/v1/events",
        content=b"[" + b",".join(bodies) + b"]",
        headers={"content-type": "application/cloudevents-batch+json", HEADER: credential},
    )

    assert answer.status_code == 403, answer.text
    body = answer.json()
    assert (body["accepted"], body["duplicate"], body["invalid"]) == (2, 0, 3)
    reasons = {row["index"]: row["reason"] for row in body["refused"]}
    assert sorted(reasons) == [1, 2, 4]
    assert reasons[1].startswith("identity: event source")
    assert "is not the enrolled instance" in reasons[1]
    assert reasons[2].startswith("not a CloudEvent")  # the contract's reason, not identity's
    assert reasons[4].startswith("identity: event instance id '1'")

    stored = (await fleet.get(f"/v1/fleet/instances/{own.source}")).json()
    assert stored["attestation"] == "attested"
    notices = (await fleet.get("/v1/fleet/notices", params={"instance": own.name})).json()
    assert [n["notice_id"] for n in notices["notices"]] == ["n-1"]
    missing = await fleet.get(f"/v1/fleet/instances/{elsewhere.source}")
    assert missing.status_code == 404
    rejected = (await fleet.get("/v1/fleet/rejected")).json()["rejected"]
    kept = sorted(row["reason"] for row in rejected if row["reason"].startswith("identity: "))
    assert kept == sorted([reasons[1], reasons[4]])

    metrics = (await fleet.get("/metrics")).text
    for outcome, count in (("attested", 2), ("refused_binding", 2)):
        line = f'fleet_identity_events_total{{source="http",outcome="{outcome}"}} {count}'
        assert line in metrics, metrics


@pytest.mark.parametrize(
    ("method", "fault", "status", "reason"),
    [
        ("gce_iit", "expired", 401, "token expired"),
        ("gce_iit", "wrong_audience", 401, "audience"),
        ("gce_iit", "bad_signature", 401, "signature does not verify"),
        ("gce_iit", "other_vm", 403, "sim-vm-other"),
        ("azure_msi", "expired", 401, "token expired"),
        ("azure_msi", "wrong_audience", 401, "audience"),
        ("azure_msi", "wrong_resource", 403, "other-rg"),
        ("azure_msi", "bad_signature", 401, "signature does not verify"),
        ("azure_msi", "other_vm", 403, "sim-vm-other"),
        ("azure_attested", "expired", 401, "expired"),
        ("azure_attested", "wrong_audience", 401, "nonce"),
        ("azure_attested", "bad_signature", 401, "not trusted"),
        ("aws_iid", "bad_signature", 401, "does not verify"),
        ("aws_iid", "other_vm", 403, "i-0fedcba9876543210"),
    ],
)
async def test_each_fault_is_refused_at_enrollment(
    sim: Simulator, fleet: httpx.AsyncClient, method: str, fault: str, status: int, reason: str
) -> None:
    sim.faults.set(CLOUD[method], attestation=fault)
    answer = await enroll(fleet, sim, method)
    assert answer.status_code == status, answer.text
    assert reason in answer.json()["error"]


async def test_azure_attested_document_of_another_vm_cannot_claim_this_one(
    sim: Simulator, fleet: httpx.AsyncClient
) -> None:
    """The attested document names vmId and subscription only: the credential binds the
    claimed resource and the vmId, so the other VM's events under this name are refused."""
    sim.faults.set("azure", attestation="other_vm")
    credential = (await enroll(fleet, sim, "azure_attested")).json()["credential"]
    answer = await post(fleet, heartbeat(vm_of(sim, "azure"), NOW), credential)
    assert answer.status_code == 403
    assert "instance id" in answer.json()["error"]


async def test_a_replayed_aws_document_is_refused_until_an_operator_allows_one_more(
    sim: Simulator, fleet: httpx.AsyncClient, tmp_path: Path
) -> None:
    assert (await enroll(fleet, sim, "aws_iid")).status_code == 200
    sim.faults.set("aws", attestation="replayed")
    again = await enroll(fleet, sim, "aws_iid")
    assert again.status_code == 403
    assert "attested before" in again.json()["error"]

    allow = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bridge", "fleet", "allow-attestation", source_of(sim, "aws")),
        *("--config", str(tmp_path / "fleet.toml")),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await allow.communicate()
    assert allow.returncode == 0, out
    assert b"may enroll once more" in out
    assert (await enroll(fleet, sim, "aws_iid")).status_code == 200
    assert (await enroll(fleet, sim, "aws_iid")).status_code == 403


async def test_the_sidecar_renews_with_its_credential_not_its_document(
    sim: Simulator, fleet: httpx.AsyncClient
) -> None:
    """AWS's document is taken once: renewals present the credential instead, so a sidecar
    keeps its identity for as long as it renews in time; a refused renewal attests again."""
    from bridge.infra.credential import EnrollmentPending, IdentitySettings
    from bridge.pipeline.enrollment import Enrollment

    now = [time.time()]
    settings = IdentitySettings(enroll_url=f"{fleet.base_url}/v1/enroll", audience=AUDIENCE)
    enrollment = Enrollment(settings, clock=lambda: now[0])
    documents = 0

    async def attest(audience: str) -> dict[str, str]:
        nonlocal documents
        documents += 1
        async with httpx.AsyncClient(timeout=10) as metadata:
            request = await enrollment_request(sim, metadata, "aws_iid")
        return {k: v for k, v in request.items() if k != "source"}

    with pytest.raises(EnrollmentPending, match="not identified"):
        await enrollment.credential()
    enrollment.identified("aws", vm_of(sim, "aws"), attest)
    first = await enrollment.credential()
    assert await enrollment.credential() == first  # held, not fetched again
    now[0] += 3600 * 0.81  # past 80 % of its life
    renewed = await enrollment.credential()
    assert renewed != first
    assert documents == 1
    assert (await post(fleet, heartbeat(vm_of(sim, "aws"), NOW), renewed)).status_code == 200
    enrollment.invalidate()
    with pytest.raises(EnrollmentPending, match="attested before"):
        await enrollment.credential()  # a new document for the same instance: refused
    assert documents == 2


@pytest.fixture
async def optional_fleet(sim: Simulator, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        running(sim, tmp_path, mode="optional") as process,
        httpx.AsyncClient(base_url=process.url, timeout=10) as http,
    ):
        yield http


async def test_optional_identity_takes_unattested_events_and_still_checks_credentials(
    sim: Simulator, optional_fleet: httpx.AsyncClient
) -> None:
    """A fleet migrating sidecar by sidecar: events without a credential pass (counted as
    unattested); a credential that is sent must verify and bind."""
    own = vm_of(sim, "gce")
    assert (await post(optional_fleet, heartbeat(own, NOW), None)).status_code == 200
    credential = (await enroll(optional_fleet, sim, "gce_iit")).json()["credential"]
    other = replace(own, id="another-id", source=own.source + "-b")
    assert (await post(optional_fleet, heartbeat(other, NOW), credential)).status_code == 403
    bad = await post(optional_fleet, heartbeat(own, NOW, sequence=1), "not-a-credential")
    assert bad.status_code == 401
    metrics = (await optional_fleet.get("/metrics")).text
    assert 'fleet_identity_events_total{source="http",outcome="unattested"} 1' in metrics

    status = (await optional_fleet.get("/v1/fleet/identity")).json()
    (row,) = status["instances"]
    assert row["source"] == own.source
    assert row["enrollment"]["method"] == "gce_iit"
    assert row["last_event_attested"] is False  # its only stored event came without one
    assert (await post(optional_fleet, heartbeat(own, NOW, sequence=2), credential)).is_success
    (row,) = (await optional_fleet.get("/v1/fleet/identity")).json()["instances"]
    assert row["last_event_attested"] is True


def attestation_gauge(metrics: str) -> dict[str, float]:
    """`fleet_instances_attestation` by its label, read with prometheus_client's parser."""
    (family,) = (
        f
        for f in text_string_to_metric_families(metrics)
        if f.name == "fleet_instances_attestation"
    )
    assert family.type == "gauge"
    return {s.labels["attestation"]: s.value for s in family.samples}


async def test_optional_identity_shows_per_instance_whether_its_events_are_attested(
    sim: Simulator, optional_fleet: httpx.AsyncClient
) -> None:
    """What an operator migrating to `required` watches: each instance attested or not
    (from the store: every replica and a restarted one agree), counted in the summary and
    in a gauge, and a filter that lists the ones still to move."""
    fleet = optional_fleet
    gce, azure = vm_of(sim, "gce"), vm_of(sim, "azure")
    assert (await post(fleet, heartbeat(azure, NOW), None)).status_code == 200
    credential = (await enroll(fleet, sim, "gce_iit")).json()["credential"]
    assert (await post(fleet, heartbeat(gce, NOW), credential)).status_code == 200

    listed = (await fleet.get("/v1/fleet/instances")).json()["instances"]
    assert {row["source"]: row["attestation"] for row in listed} == {
        gce.source: "attested",
        azure.source: "unattested",
    }
    one = (await fleet.get(f"/v1/fleet/instances/{azure.source}")).json()
    assert one["attestation"] == "unattested"
    still = (await fleet.get("/v1/fleet/instances?attestation=unattested")).json()
    assert [row["source"] for row in still["instances"]] == [azure.source]
    bad = await fleet.get("/v1/fleet/instances?attestation=maybe")
    assert bad.status_code == 400
    assert bad.json()["error"].startswith("attestation")
    summary = (await fleet.get("/v1/fleet/summary")).json()["instances"]
    assert summary["by_attestation"] == {"attested": 1, "unattested": 1, "unchecked": 0}
    assert attestation_gauge((await fleet.get("/metrics")).text) == {
        "attested": 1.0,
        "unattested": 1.0,
        "unchecked": 0.0,
    }

    # The Azure sidecar enrolls too: the fleet may now switch to `required`.
    azure_credential = (await enroll(fleet, sim, "azure_msi")).json()["credential"]
    moved = await post(fleet, heartbeat(azure, NOW, sequence=1), azure_credential)
    assert moved.status_code == 200, moved.text
    assert (await fleet.get(f"/v1/fleet/instances/{azure.source}")).json()[
        "attestation"
    ] == "attested"
    assert attestation_gauge((await fleet.get("/metrics")).text)["unattested"] == 0.0


async def test_enrollment_requests_are_bounded_and_checked(fleet: httpx.AsyncClient) -> None:
    huge = await fleet.post("/v1/enroll", content=b"{" + b" " * 40_000 + b"}")
    assert huge.status_code == 413
    assert (await fleet.post("/v1/enroll", content=b"[]")).status_code == 400
    unknown = await fleet.post("/v1/enroll", json={"method": "tpm", "source": "x", "document": "y"})
    assert unknown.status_code == 400
    assert "unknown method" in unknown.json()["error"]
    missing = await fleet.post("/v1/enroll", json={"method": "gce_iit", "source": "x"})
    assert missing.status_code == 400
    assert "'document'" in missing.json()["error"]
