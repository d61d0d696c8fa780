"""One bad field stays one bad field: the watchers carry on with the rest of the document.

Through the real pipeline (simulator over HTTP, spool, dispatcher, a sink that validates
every event against the schema). The simulator only serves well-typed documents, so the
tests change an event it holds to what a broken IMDS could send (types it never declares):
that is the fault under test, not a mock.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from bridge.infra.backoff import for_humans
from bridge.providers.azure.watcher import parse_document
from bridge.providers.gce.watcher import parse_upcoming
from bridge.runner import ProviderName
from bridge.simulator import Simulator
from tests.support import running_bridge

AZURE: tuple[ProviderName, ...] = ("azure",)


def corrupt(sim: Simulator, event_id: str, **fields: Any) -> None:
    """Make the simulator serve odd values in one of its events (IMDS field names)."""
    event = sim.azure.find(event_id)
    assert event is not None
    names = {
        "NotBefore": "not_before",
        "Description": "description",
        "EventSource": "source",
        "DurationInSeconds": "duration",
        "Resources": "resources",
        "EventId": "event_id",
        "EventStatus": "status",
    }
    for name, value in fields.items():
        setattr(event, names[name], value)


@pytest.mark.parametrize(
    ("not_before", "read_as"),
    [
        ("2020-11-23T10:00:00", "2020-11-23T10:00:00Z"),  # RFC 3339 without a zone
        ("Mon, 23 Nov 2020 10:00:00", "2020-11-23T10:00:00Z"),  # RFC 1123 without GMT
    ],
)
async def test_azure_not_before_without_a_zone_is_utc_also_after_a_restart(
    azure_sim: Simulator, tmp_path: Path, not_before: str, read_as: str
) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        event_id = azure_sim.azure.add_event(event_type="Reboot")
        corrupt(azure_sim, event_id, NotBefore=not_before)
        (scheduled,) = await run.wait_for(1)
    assert scheduled["data"]["not_before"] == read_as
    azure_sim.azure.remove_event(event_id)  # its time came and it ran while we were down
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        (completed,) = await run.wait_for(1)
    assert completed["data"]["status"] == "completed"
    assert completed["data"]["not_before"] == read_as


async def test_azure_unreadable_not_before_costs_the_field_not_the_event(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        event_id = azure_sim.azure.add_event(event_type="Freeze")
        corrupt(azure_sim, event_id, NotBefore="next tuesday")
        (scheduled,) = await run.wait_for(1)
        assert run.bridge.watchers["azure"].stats.skipped == 1
    assert scheduled["data"]["notice_id"] == event_id
    assert scheduled["data"]["not_before"] is None


async def test_azure_malformed_events_of_other_vms_do_not_block_ours(
    azure_sim: Simulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        ours = azure_sim.azure.add_event(event_type="Reboot")
        other = azure_sim.azure.add_event(event_type="Freeze", resources=["other-vm"])
        nameless = azure_sim.azure.add_event(event_type="Freeze", resources=["third-vm"])
        corrupt(azure_sim, other, Description=["x"], EventStatus=3, NotBefore=None)
        corrupt(azure_sim, nameless, EventId=42, DurationInSeconds={"s": 1})
        (scheduled,) = await run.wait_for(1)
        await run.settle()
        assert run.bridge.watchers["azure"].stats.skipped == 1  # the event without an id
    assert scheduled["data"]["notice_id"] == ours
    skipped = [r.getMessage() for r in caplog.records if "skipped an unreadable" in r.getMessage()]
    assert skipped == ["skipped an unreadable event: event #2 has no string EventId"]  # once


def test_an_event_that_cannot_be_attributed_is_refused_alone() -> None:
    document = parse_document(
        b'{"DocumentIncarnation": 3, "Events": ['
        b'{"EventId": "A", "Resources": "vm-1"}, 7, {"EventId": "B", "Resources": ["vm-1"]}]}'
    )
    assert [e["EventId"] for e in document.events] == ["B"]
    assert [key for key, _ in document.refused] == ["A", "#1"]


async def test_azure_fields_of_the_wrong_type_are_coerced_or_dropped(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        event_id = azure_sim.azure.add_event(event_type="Reboot")
        corrupt(
            azure_sim,
            event_id,
            Description={"text": "an object"},
            EventSource=7,
            DurationInSeconds="30",
        )
        (scheduled,) = await run.wait_for(1)  # the sink validated it against schemas/
    data = scheduled["data"]
    assert (data["description"], data["origin"], data["duration_seconds"]) == (None, None, 30)
    assert data["raw"]["Description"] == {"text": "an object"}  # raw stays as received


async def test_azure_unknown_status_is_logged_once_per_event(
    azure_sim: Simulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        event_id = azure_sim.azure.add_event(event_type="Reboot")
        corrupt(azure_sim, event_id, EventStatus="Pondering")
        await run.wait_for(1)
        polls = len(azure_sim.requests)
        await run.settle(1.0)
        assert len(azure_sim.requests) >= polls + 2
    warnings = [r for r in caplog.records if "unknown EventStatus" in r.getMessage()]
    assert len(warnings) == 1


async def test_gce_bad_window_time_costs_the_field_and_never_delays_maintenance_event(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(gce_sim, tmp_path) as run:
        await run.settle(0.3)
        gce_sim.gce.set_upcoming_maintenance(
            {
                "window_start_time": "not-a-time",
                "window_end_time": "2026-12-02T01:56:20",  # zone-less: UTC
                "maintenance_status": "PENDING",
            }
        )
        (upcoming,) = await run.wait_for(1)
        gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        await run.wait_for(2)
        assert run.bridge.watchers["gce"].stats.skipped == 1
    assert run.sink.summary()[1] == ("live-migrate", "started")
    assert upcoming["data"]["window"] == {
        "start": None,
        "end": "2026-12-02T01:56:20Z",
        "latest_start": None,
    }


@pytest.mark.parametrize("depth", [100_000])
def test_a_document_nested_too_deep_is_a_malformed_document(depth: int) -> None:
    body = "[" * depth + "]" * depth
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_document(body.encode())
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_upcoming(200, body)


def test_nan_is_not_json() -> None:
    with pytest.raises(ValueError, match="NaN is not JSON"):
        parse_document(b'{"DocumentIncarnation": 1, "Events": [{"EventId": NaN}]}')


@pytest.mark.parametrize(
    ("seconds", "said"), [(0.5, "0.5s"), (0.04, "0.04s"), (1.0, "1s"), (2.25, "2.2s"), (30, "30s")]
)
def test_delays_are_logged_as_they_are(seconds: float, said: str) -> None:
    assert for_humans(seconds) == said


async def test_metadata_retries_log_the_real_delay(
    azure_sim: Simulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bridge.metadata")
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        await run.settle(0.3)
        azure_sim.faults.set(provider="azure", malformed=1)
        azure_sim.azure.add_event(event_type="Freeze")
        await run.wait_for(1)
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert retries
    assert all("retrying in 0s" not in line and "in 0.0s" not in line for line in retries)
