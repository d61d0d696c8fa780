"""A SQLite connection that records the statements run through it, so that plan tests
EXPLAIN the queries the code sends as it is, whatever its SQL becomes (reads, retention
batches, searches). PostgreSQL's plan tests have their own (`test_postgres_store.Capture`:
it rewrites the placeholders as the store's adapter does)."""

from __future__ import annotations

from typing import Any


class Capture:
    """Passes everything to `db`; keeps each `execute`'s statement and parameters."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.statements: list[tuple[str, list[Any]]] = []

    def execute(self, statement: str, params: Any = ()) -> Any:
        self.statements.append((statement, list(params)))
        return self.db.execute(statement, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)
