"""A store outage for the source tests: commits fail while the test says so."""

from __future__ import annotations

from collections.abc import Sequence

from bridge.fleet.sqlite_store import SqliteStore
from bridge.fleet.store import Batch, IngestResult, StoreError


class FailingStore(SqliteStore):
    """A real SQLite store whose commits fail while `failing` is set (SQLite cannot be made
    to fail on demand; this stands in for a store outage, nothing else is replaced)."""

    failing = True
    attempts = 0

    async def ingest_many(self, batches: Sequence[Batch]) -> list[IngestResult]:
        self.attempts += 1
        if self.failing:
            raise StoreError("simulated outage of the fleet store")
        return await super().ingest_many(batches)
