"""`[coordination] group = "zone"` and `zone_naming`: Azure's zone `2` of two regions.

With the default (`reported`, the naming every sidecar used so far, so that a rolling
upgrade keeps one key space) both regions' zone 2 share one budget; with `fleet` each is its
own (`zone:eastus-2`, `zone:westeurope-2`), named by the very function the fleet files VMs
with. The budget runs against a real etcd (Debian's etcd-server, tests/etcd_server.py).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bridge import contract
from bridge.actions.coordination.budget import build, group_of
from bridge.actions.coordination.settings import Coordination
from bridge.config import ConfigError, parse_config
from bridge.fleet import state
from bridge.infra.validation import validate
from tests.etcd_server import EtcdServer
from tests.etcd_server import etcd as etcd
from tests.test_cli import bridge, write_config

PREFIX = "/mb-zones/"


def _vm(name: str, zone: str | None, location: str | None) -> contract.InstanceData:
    unset = dict.fromkeys(("project", "subscription", "resource_group", "scale_set"), None)
    fields = {"id": name, "name": name, "resource_id": name, "zone": zone, "location": location}
    return msgspec.convert({**fields, **unset}, contract.InstanceData)


EAST_2 = _vm("east-vm", "2", "eastus")
WEST_2 = _vm("west-vm", "2", "westeurope")
#: Zones that name their region already, and a VM without a zone: the same under both.
OTHERS = [
    _vm("gce-vm", "europe-west1-b", "europe-west1"),
    _vm("aws-vm", "us-east-1a", "us-east-1"),
    _vm("azure-no-zone", None, "northeurope"),
]


def _settings(**table: Any) -> Coordination:
    return validate(Coordination, {"endpoints": ["http://etcd:2379"], "group": "zone", **table})


def test_by_default_zone_2_of_two_regions_is_still_one_group() -> None:
    reported = _settings()
    assert reported.zone_naming == "reported"
    assert group_of(reported, EAST_2) == group_of(reported, WEST_2) == "zone:2"


def test_with_the_fleet_naming_each_region_has_its_own_zone_group_as_the_fleet_files_it() -> None:
    fleet = _settings(zone_naming="fleet")
    assert group_of(fleet, EAST_2) == "zone:eastus-2"
    assert group_of(fleet, WEST_2) == "zone:westeurope-2"
    for vm in (EAST_2, WEST_2, *OTHERS):
        assert group_of(fleet, vm) == f"zone:{state.zone_of(vm.zone, vm.location)}"
    assert state.zone_of is contract.zone_of  # one function, not a copy


def test_only_azure_zones_change_name_so_only_their_keys_move() -> None:
    reported, fleet = _settings(), _settings(zone_naming="fleet")
    for vm in OTHERS:
        assert group_of(reported, vm) == group_of(fleet, vm)
    assert group_of(fleet, _vm("nowhere", None, None)) == "zone:unknown"


def test_an_unknown_naming_is_refused_naming_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"coordination": {"endpoints": ["http://e:2379"], "zone_naming": "x"}})
    assert caught.value.problems == ["coordination.zone_naming: must be one of 'reported', 'fleet'"]
    config = write_config(
        tmp_path / "bridge.toml",
        '[coordination]\nendpoints = ["http://etcd:2379"]\ngroup = "zone"\nzone_naming = "fleet"\n',
    )
    checked = bridge("validate-config", str(config))
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    ("naming", "groups", "outcomes"),
    [
        ("reported", ["zone:2", "zone:2"], ["acquired", "timed-out"]),
        ("fleet", ["zone:eastus-2", "zone:westeurope-2"], ["acquired", "acquired"]),
    ],
)
async def test_budget_one_in_etcd_per_naming(
    etcd: EtcdServer, naming: str, groups: list[str], outcomes: list[str]
) -> None:
    settings = validate(
        Coordination,
        {
            "endpoints": [etcd.url],
            "group": "zone",
            "zone_naming": naming,
            "budget": 1,
            "prefix": PREFIX,
            "poll_interval": 0.1,
            "request_timeout": 1.0,
        },
    )
    east, west = build(settings), build(settings)  # two sidecars, one VM each
    try:
        deadline = datetime.now(UTC) + timedelta(seconds=1)
        grants = [
            await budget.take(
                f"notice-{vm.name}", vm, action="hook", deadline=deadline, wanted=lambda: True
            )
            for budget, vm in ((east, EAST_2), (west, WEST_2))
        ]
        assert [g.group for g in grants] == groups
        assert [g.outcome for g in grants] == outcomes
        held = etcd.keys(f"{PREFIX}budget/")
        assert sorted(held) == sorted(
            f"{PREFIX}budget/{g.group}/slot-0" for g in grants if g.outcome == "acquired"
        )
    finally:
        await east.aclose()
        await west.aclose()
