"""The fleet the API, dashboard and Grafana tests share: four VMs reporting, one silent, and
notices in force, in the past and to come, all relative to `NOW`.

Heartbeats say whether a VM is reporting or silent by the wall clock, and a full run lasts
minutes, so `NOW` and `FLEET` are rebuilt before each test (`refresh`, an autouse fixture
in conftest.py). `FLEET` is refreshed in place, so `from ... import FLEET` stays current;
`NOW` is a plain value: read it as `world.NOW` or through `minutes(0)`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bridge.pipeline.model import Kind, Status
from tests.fleet.factories import azure_vm, gce_vm, heartbeat, transition

NOW = datetime.now(UTC)
WEB1, WEB2 = gce_vm("web-1"), gce_vm("web-2", zone="europe-west1-b")
DB1, DB2 = azure_vm("db-1", scale_set="db-set"), azure_vm("db-2", scale_set="db-set")
QUIET = gce_vm("quiet-1")  # a heartbeat long ago: silent


def minutes(n: float) -> datetime:
    return NOW + timedelta(minutes=n)


def _fleet() -> list[bytes]:
    return [
        *(heartbeat(vm, minutes(-1)) for vm in (WEB1, WEB2, DB1, DB2)),
        heartbeat(QUIET, minutes(-60)),
        transition(WEB1, "g-1", Status.STARTED, minutes(-2), kind=Kind.LIVE_MIGRATE),
        transition(DB1, "ev-1", Status.SCHEDULED, minutes(-5), not_before=minutes(10)),
        transition(DB2, "ev-2", Status.SCHEDULED, minutes(-5), not_before=minutes(600)),
        transition(WEB2, "g-2", Status.SCHEDULED, minutes(-5), kind=Kind.TERMINATE),  # no time
        transition(DB2, "ev-0", Status.SCHEDULED, minutes(-50), not_before=minutes(-40)),
        transition(DB2, "ev-0", Status.COMPLETED, minutes(-30)),
    ]


FLEET: list[bytes] = _fleet()


def refresh() -> None:
    """`NOW` is now again, and `FLEET` (in place) is built around it."""
    global NOW
    NOW = datetime.now(UTC)
    FLEET[:] = _fleet()
