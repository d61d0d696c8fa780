"""The bus sources' screening (`bridge.fleet.sources.bus.Committer`) against a real SQLite
store: each message is judged alone by the credential it carries, as of the time the bus
took it, and whatever is refused lands in `rejected` with its reason while the rest commits.
The buses themselves are in test_bus_identity.py; here the clock is the point, so the gate's
credentials take a clock the test moves (the credential's minimum life is a minute)."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from bridge.fleet.bus_config import PubsubSourceConfig
from bridge.fleet.identity.credential import Credentials
from bridge.fleet.identity.gate import IdentityGate
from bridge.fleet.identity.model import Attested
from bridge.fleet.metrics import IngestStats
from bridge.fleet.service import build_store
from bridge.fleet.sources.base import Ingestor
from bridge.fleet.sources.bus import Committer, Decoded
from bridge.fleet.store import InstanceQuery
from tests.fleet.factories import gce_vm, heartbeat

NOW = datetime.now(UTC)
CONFIG = PubsubSourceConfig(subscription="projects/p/subscriptions/s", identity="required")


async def test_messages_are_screened_alone_as_of_when_the_bus_took_them(tmp_path: Path) -> None:
    vm = gce_vm("web-1")
    other = replace(vm, id="another", source=vm.source + "-b")
    now = [time.time()]
    credentials = Credentials(b"k" * 32, "https://fleet", 3600, clock=lambda: now[0])
    attested = Attested(provider="gce", method="gce_iit", id=vm.id, source=vm.source)
    sent = now[0]
    token = credentials.issue(attested).token
    now[0] += 7200  # the fleet was down two hours; the credential expired meanwhile
    gate = IdentityGate("required", credentials, "pubsub")
    store = build_store(f"sqlite://{tmp_path}/fleet.db")
    await store.open()
    try:
        committer = Committer("pubsub", Ingestor(store, IngestStats()), CONFIG, gate)
        result = await committer.commit(
            [
                Decoded(heartbeat(vm, NOW), credential=token, sent_at=sent + 1),
                Decoded(heartbeat(other, NOW), credential=token, sent_at=sent + 2),
                Decoded(heartbeat(vm, NOW, sequence=1), credential=token),  # no bus time
                Decoded(heartbeat(vm, NOW, sequence=2)),  # no credential
            ]
        )
        reasons = sorted(row["reason"] for row in await store.rejected())
        marked = await store.instance_page(InstanceQuery(attestation="attested"))
    finally:
        await store.close()
    assert (result.accepted, result.invalid) == (1, 3)
    assert [r.split(":")[1].strip() for r in reasons] == [
        "credential expired",
        "event source " + repr(other.source) + " is not the enrolled instance " + repr(vm.source),
        "no credential",
    ], reasons
    assert [row["source"] for row in marked.rows] == [vm.source]  # its own, marked attested
    assert gate.counts == {
        ("pubsub", "attested"): 1,
        ("pubsub", "refused_binding"): 1,
        ("pubsub", "refused_credential"): 2,
    }
