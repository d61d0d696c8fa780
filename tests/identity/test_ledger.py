"""AWS trust on first use, in both fleet stores (SQLite, and a real PostgreSQL server:
tests/fleet/postgres_server.py, skipped without its binaries, failing under CI=true): the
first enrollment of an instance wins, the next is refused until an operator allows exactly
one more, and a reopened store remembers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.fleet.identity.ledger import StoreLedger
from bridge.fleet.service import build_store
from bridge.fleet.store import Store

pytest_plugins = ["tests.fleet.postgres_server"]
ARN = "arn:aws:ec2:us-east-1:123456789012:instance/i-1234567890abcdef0"


@pytest.fixture(params=["sqlite", "postgresql"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    if request.param == "sqlite":
        url = f"sqlite://{tmp_path / 'fleet.sqlite3'}"
    else:
        url = request.getfixturevalue("postgres_url")
    return lambda: build_store(url)


async def test_first_use_then_refused_until_allowed_once(make_store: Callable[[], Store]) -> None:
    store = make_store()
    await store.open()
    ledger = StoreLedger(store)
    assert await ledger.allow(ARN) is False  # never enrolled: nothing to allow
    assert await ledger.first_use(ARN, 1.0) is True
    assert await ledger.first_use(ARN, 2.0) is False
    await store.close()

    reopened = make_store()
    await reopened.open()
    ledger = StoreLedger(reopened)
    assert await ledger.first_use(ARN, 3.0) is False
    assert await ledger.allow(ARN) is True
    assert await ledger.first_use(ARN, 4.0) is True
    assert await ledger.first_use(ARN, 5.0) is False
    assert await ledger.first_use(ARN.replace("i-1", "i-2"), 6.0) is True
    await reopened.close()


async def test_every_enrollment_is_recorded(make_store: Callable[[], Store]) -> None:
    store = make_store()
    await store.open()
    ledger = StoreLedger(store)
    gce = "//compute.googleapis.com/projects/p/zones/z/instances/web-1"
    await ledger.record(gce, "gce_iit", 1.0)
    await ledger.record(gce, "gce_iit", 5.0)
    assert await ledger.first_use(ARN, 2.0) is True
    enrolled = await ledger.enrolled()
    assert enrolled[gce] == {"method": "gce_iit", "first_at": 1.0, "last_at": 5.0, "enrollments": 2}
    assert enrolled[ARN]["method"] == "aws_iid"
    await store.close()
