"""End to end over HTTP: five real `maintenance-bridge run` processes watching simulated VMs
(two GCE, three Azure VMs of one group) deliver through their webhook sinks to a real
`maintenance-bridge fleet` process. The fleet is killed with SIGKILL mid-stream and started
again while the sidecars keep observing; one sidecar's events are dead-lettered (a mistyped
url) and replayed with `spool replay`; the whole audit log is then posted again. At the end
every transition the simulators played is in the fleet exactly once, and nothing else is.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge.providers.azure.simulated.group import AzureGroup
from bridge.simulator import Simulator
from bridge.transports import webhook_signing as signing
from tests.fleet.conftest import SECRET
from tests.support import eventually, free_port
from tests.test_cli import bridge
from tests.test_crash import Process

pytestmark = pytest.mark.slow

GROUP = ["db-1", "db-2", "db-3"]
FREEZE = "22222222-0000-4000-8000-000000000001"
KEY = "instance/maintenance-event"
STATUSES = ("scheduled", "started", "completed")


class FleetProcess(Process):
    """`maintenance-bridge fleet`, started and ready (its /readyz answers 200)."""

    def __init__(self, config: Path, url: str) -> None:
        super().__init__(config, "fleet")
        self.url = url

    async def start(self) -> None:
        await super().start()

        async def ready() -> bool:
            try:
                async with httpx.AsyncClient(base_url=self.url) as http:
                    return (await http.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(ready, timeout=30)


def fleet_config(path: Path, port: int, more: str = "") -> Path:
    """A fleet on `port` with its SQLite store in `path`, taking signed posts; `more` is TOML
    appended as is."""
    config = path / "fleet.toml"
    config.write_text(
        f'[fleet.listener]\nport = {port}\n[fleet.store]\nurl = "sqlite://{path}/fleet.db"\n'
        f'[[fleet.sources]]\ntype = "http"\nsecrets = ["{SECRET}"]\n{more}'
    )
    return config


def sidecar_config(path: Path, provider: str, source: dict[str, str], url: str, mode: str) -> Path:
    settings = "\n".join(f'{key} = "{value}"' for key, value in source.items())
    path.mkdir(parents=True, exist_ok=True)
    config = path / "bridge.toml"
    config.write_text(f"""
[source]
provider = "{provider}"
[source.{provider}]
{settings}
[state]
dir = "{path / "state"}"
[listener]
enabled = false
[delivery]
retry_initial = 0.05
retry_max = 0.5
[heartbeat]
interval = 1
[[sinks]]
type = "webhook"
name = "fleet"
url = "{url}"
mode = "{mode}"
signing = "standard"
secrets = ["{SECRET}"]
""")
    return config


def spooled(state: Path, query: str) -> int:
    """A count from a running sidecar's spool (read-only; WAL lets us in)."""
    db = sqlite3.connect(f"file:{state / 'spool.sqlite3'}?mode=ro", uri=True)
    try:
        (count,) = db.execute(query).fetchone()
        return int(count)
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


PENDING_MAINTENANCE = (
    "SELECT COUNT(*) FROM pending p JOIN events e ON e.seq = p.seq "
    "WHERE e.type LIKE 'io.maintenancebridge.maintenance.%'"
)
DEAD_SCHEDULED = (
    "SELECT COUNT(*) FROM dead_letters d JOIN events e ON e.seq = d.seq "
    "WHERE e.type = 'io.maintenancebridge.maintenance.scheduled'"
)


async def audit_log(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    path: str | None = "/v1/fleet/events?limit=500"
    while path is not None:
        answer = await http.get(path)
        events += answer.json()
        link = answer.headers.get("link")
        path = link[1 : link.index(">")] if link else None
    return events


def transitions(events: list[dict[str, Any]]) -> Counter[tuple[str, str, str]]:
    return Counter(
        (e["subject"], e["data"]["notice_id"], e["data"]["status"])
        for e in events
        if e["type"].startswith("io.maintenancebridge.maintenance.")
    )


async def test_five_sidecars_into_the_fleet_each_transition_exactly_once(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    fleet = FleetProcess(fleet_config(tmp_path, port), url)
    spot = {"gce": {"instance_name": "web-2", "zone": "europe-west1-b"}}
    sidecars: dict[str, Process] = {}
    async with (
        Simulator("azure", identity={"azure": {"name": "db-1"}}) as azure,
        Simulator("gce", identity={"gce": {"instance_name": "web-1"}}) as gce1,
        Simulator("gce", identity=spot) as gce2,
        AzureGroup(azure, GROUP) as group,
        httpx.AsyncClient(base_url=url) as http,
    ):
        azure.faults.set(provider="azure", rate_limit=False)
        await fleet.start()
        configs = {
            "web-1": sidecar_config(
                tmp_path / "web-1",
                "gce",
                {"metadata_url": gce1.gce_url},
                f"{url}/v1/events",
                "structured",
            ),
            "web-2": sidecar_config(
                tmp_path / "web-2",
                "gce",
                {"metadata_url": gce2.gce_url},
                f"{url}/v1/events",
                "binary",
            ),
        }
        for name in GROUP:  # db-3's url is mistyped: its events end in the dead letters
            target = f"{url}/v1/event" if name == "db-3" else f"{url}/v1/events"
            source = {"imds_url": group.imds_url(name), "poll_interval": "0.25"}
            configs[name] = sidecar_config(tmp_path / name, "azure", source, target, "batch")
        try:
            for name, config in configs.items():
                sidecars[name] = Process(config)
                await sidecars[name].start()

            async def instances() -> set[str]:
                body = (await http.get("/v1/fleet/instances?state=reporting")).json()
                return {i["name"] for i in body["instances"]}

            await eventually(lambda: _eq(instances(), {"web-1", "web-2", "db-1", "db-2"}), 30)

            # Phase 1: scheduled for the group, a live migration on web-1.
            azure.azure.add_event(
                event_id=FREEZE, event_type="Freeze", resources=GROUP, auto_complete=False
            )
            gce1.gce.set(KEY, "MIGRATE_ON_HOST_MAINTENANCE")

            async def notices() -> int:
                return int((await http.get("/v1/fleet/notices")).json()["count"])

            await eventually(lambda: _eq(notices(), 3), 30)
            db3 = functools.partial(spooled, tmp_path / "db-3" / "state", DEAD_SCHEDULED)
            await eventually(db3, 30)  # db-3 saw it too (and the fleet refused its url)

            # The fleet dies mid-stream; the sidecars keep observing and spooling.
            await fleet.kill()
            azure.azure.start_event(FREEZE)
            gce1.gce.set(KEY, "NONE")
            gce2.gce.set(KEY, "TERMINATE_ON_HOST_MAINTENANCE")
            for name in ("web-1", "web-2", "db-1", "db-2"):
                state = tmp_path / name / "state"
                await eventually(functools.partial(spooled, state, PENDING_MAINTENANCE), 30)
            await fleet.start()
            azure.azure.remove_event(FREEZE)
            gce2.gce.set(KEY, "NONE")

            async def delivered() -> Counter[tuple[str, str, str]]:
                return transitions(await audit_log(http))

            async def complete(vms: tuple[str, ...] = ("db-1", "db-2")) -> bool:
                seen = await delivered()
                azure_ok = all(seen[(vm, FREEZE, s)] == 1 for vm in vms for s in STATUSES)
                return azure_ok and len([k for k in seen if k[0].startswith("web-")]) == 4

            await eventually(complete, 60)

            # db-3: fix its url, replay its dead letters, start it again.
            await sidecars["db-3"].stop()
            text = configs["db-3"].read_text().replace('/v1/event"', '/v1/events"')
            configs["db-3"].write_text(text)
            replay = await asyncio.to_thread(
                bridge, "spool", "replay", "--config", str(configs["db-3"])
            )
            assert replay.returncode == 0, replay.stderr
            await sidecars["db-3"].start()

            await eventually(lambda: complete(tuple(GROUP)), 60)

            # Everything posted again (a bus redelivering it all): only duplicates.
            log = await audit_log(http)
            body = b"[" + b",".join(json.dumps(e).encode() for e in log) + b"]"
            headers = signing.standard_headers(
                "again", int(time.time()), body, [signing.standard_key(SECRET)]
            )
            headers["content-type"] = "application/cloudevents-batch+json"
            again = (await http.post("/v1/events", content=body, headers=headers)).json()
            assert (again["accepted"], again["invalid"]) == (0, 0)
            assert again["duplicate"] == len(log)
        finally:
            for process in sidecars.values():
                with contextlib.suppress(Exception):
                    await process.stop()
            await fleet.stop()
    seen = transitions(log)
    assert set(seen.values()) == {1}  # each transition exactly once
    assert sorted(seen) == sorted(
        [(vm, FREEZE, s) for vm in GROUP for s in ("scheduled", "started", "completed")]
        + [k for k in seen if k[0].startswith("web-")]
    )
    gce = sorted((k[0], k[2]) for k in seen if k[0].startswith("web-"))
    assert gce == [
        ("web-1", "completed"),
        ("web-1", "started"),
        ("web-2", "completed"),
        ("web-2", "started"),
    ]
    ids = [(e["source"], e["id"]) for e in log]
    assert len(ids) == len(set(ids))


async def _eq(value: Any, expected: Any) -> bool:
    return bool(await value == expected)
