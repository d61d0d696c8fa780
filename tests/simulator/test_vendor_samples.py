"""Done-when: the vendors' own samples, unmodified except for the base URL, behave against
the simulator as the vendor pages describe."""

# mypy: allow-untyped-calls
from __future__ import annotations

import threading
import time

import pytest

from bridge.simulator import SimulatorThread

from . import azure_sample, google_sample


class _Done(Exception):
    """Raised by the callback to end the sample's infinite loop."""


def _wait_until(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


def test_google_wait_for_maintenance_sees_migration_and_does_not_busy_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str | None] = []

    def callback(event: str | None) -> None:
        seen.append(event)
        if event is None and "MIGRATE_ON_HOST_MAINTENANCE" in seen:
            raise _Done

    errors: list[BaseException] = []

    def run() -> None:
        try:
            google_sample.wait_for_maintenance(callback)
        except _Done:
            pass
        except BaseException as exc:
            errors.append(exc)

    with SimulatorThread(provider="gce", scenario="gce-live-migration") as sim:
        monkeypatch.setattr(google_sample, "METADATA_URL", sim.gce_url)
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        # the sample's first request (last_etag=0) returns at once, the second one hangs
        _wait_until(lambda: len(sim.requests) >= 2)
        time.sleep(0.3)  # a busy loop would pile up hundreds of requests here
        assert len(sim.requests) == 2
        assert sim.gce.maintenance_event_watched

        sim.clock.advance(120)  # the 60 s warning: MIGRATE_ON_HOST_MAINTENANCE
        _wait_until(lambda: seen == ["MIGRATE_ON_HOST_MAINTENANCE"])
        sim.clock.advance(75)  # migration over: NONE
        worker.join(timeout=5)

        assert not worker.is_alive()
        assert errors == []
        assert seen == ["MIGRATE_ON_HOST_MAINTENANCE", None]
        requests_seen = sim.requests
        assert len(requests_seen) <= 4
        assert all(r.status == 200 for r in requests_seen)
        assert requests_seen[0].query["wait_for_change"] == "True"  # how requests encodes True


def test_google_sample_retries_503_bursts(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []

    def callback(event: str | None) -> None:
        seen.append(event)
        raise _Done

    with SimulatorThread(provider="gce") as sim:
        monkeypatch.setattr(google_sample, "METADATA_URL", sim.gce_url)
        sim.gce.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        sim.faults.set("gce", status_burst=(503, 1))
        with pytest.raises(_Done):
            google_sample.wait_for_maintenance(callback)
        assert seen == ["TERMINATE_ON_HOST_MAINTENANCE"]
        assert [r.status for r in sim.requests] == [503, 200]


def test_azure_sample_sees_the_documented_freeze_sequence_and_confirms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    event_id = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
    with SimulatorThread(provider="azure", scenario="azure-freeze") as sim:
        monkeypatch.setattr(azure_sample, "metadata_url", sim.azure_url + "scheduledevents")

        doc = azure_sample.get_scheduled_events()
        assert doc == {"DocumentIncarnation": 1, "Events": []}

        sim.clock.advance(5)
        doc = azure_sample.get_scheduled_events()
        assert doc["DocumentIncarnation"] == 2
        (event,) = doc["Events"]
        assert event["EventId"] == event_id
        assert event["EventStatus"] == "Scheduled"
        assert event["Resources"] == ["WestNO_0", "WestNO_1"]
        assert event["NotBefore"].endswith(" GMT")
        assert sim.identity.azure.name == "WestNO_0"

        assert azure_sample.confirm_scheduled_event(event_id) == 200
        doc = azure_sample.get_scheduled_events()
        assert doc["DocumentIncarnation"] == 3
        assert doc["Events"][0]["EventStatus"] == "Started"
        assert doc["Events"][0]["NotBefore"] == ""
        assert sim.azure.approvals == [event_id]

        sim.clock.advance(9)  # the freeze lasts a few seconds, then the event is gone
        assert azure_sample.get_scheduled_events() == {"DocumentIncarnation": 4, "Events": []}


def test_azure_freeze_plays_by_itself_when_nobody_approves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with SimulatorThread(provider="azure", scenario="azure-freeze") as sim:
        monkeypatch.setattr(azure_sample, "metadata_url", sim.azure_url + "scheduledevents")
        incarnations = []
        statuses = []
        for step in (0, 5, 900, 9):
            sim.clock.advance(step)
            doc = azure_sample.get_scheduled_events()
            incarnations.append(doc["DocumentIncarnation"])
            statuses.append([e["EventStatus"] for e in doc["Events"]])
        assert incarnations == [1, 2, 3, 4]
        assert statuses == [[], ["Scheduled"], ["Started"], []]
        assert sim.azure.approvals == []
