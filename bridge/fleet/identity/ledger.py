"""Enrollments recorded in the fleet store (table `attestations`): which instance attested
how and when (`GET /v1/fleet/identity`), and AWS trust on first use.

An AWS instance identity document never changes and never expires, so whoever read it once
(a process on the VM, a log, a backup) can present it again. As SPIRE's `aws_iid` attestor
does, the first enrollment of an instance wins and each later one is refused until an
operator allows one more (`allow`): after a reinstall of the sidecar, say. The rows live in
the fleet store (SQLite or PostgreSQL), so every replica of the fleet sees the same.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import IO, Any, Final

from bridge.fleet.store import Store

_CREATE: Final = """CREATE TABLE IF NOT EXISTS attestations (
    instance TEXT PRIMARY KEY,
    method TEXT NOT NULL,
    first_at DOUBLE PRECISION NOT NULL,
    last_at DOUBLE PRECISION NOT NULL,
    enrollments INTEGER NOT NULL,
    allowed INTEGER NOT NULL
)"""


class StoreLedger:
    """`Ledger` over the fleet store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def first_use(self, instance: str, now: float) -> bool:
        def claim(db: Any) -> bool:
            db.execute(_CREATE)
            row = db.execute(
                "SELECT allowed FROM attestations WHERE instance = ?", (instance,)
            ).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO attestations (instance, method, first_at, last_at, enrollments,"
                    " allowed) VALUES (?, 'aws_iid', ?, ?, 1, 0)",
                    (instance, now, now),
                )
                return True
            if not row[0]:
                return False
            db.execute(
                "UPDATE attestations SET last_at = ?, enrollments = enrollments + 1,"
                " allowed = 0 WHERE instance = ?",
                (now, instance),
            )
            return True

        return await self.store.transaction(claim)

    async def record(self, instance: str, method: str, now: float) -> None:
        """An attestation (other than AWS's, which `first_use` records) of `instance`."""

        def upsert(db: Any) -> None:
            db.execute(_CREATE)
            db.execute(
                "INSERT INTO attestations (instance, method, first_at, last_at, enrollments,"
                " allowed) VALUES (?, ?, ?, ?, 1, 0) ON CONFLICT (instance) DO UPDATE SET"
                " method = excluded.method, last_at = excluded.last_at,"
                " enrollments = attestations.enrollments + 1",
                (instance, method, now, now),
            )

        await self.store.transaction(upsert)

    async def enrolled(self) -> dict[str, dict[str, Any]]:
        """Every instance that ever attested: its method, first and last time, count."""

        def rows(db: Any) -> dict[str, dict[str, Any]]:
            db.execute(_CREATE)
            found = db.execute(
                "SELECT instance, method, first_at, last_at, enrollments FROM attestations"
                " ORDER BY instance"
            ).fetchall()
            return {
                r[0]: {"method": r[1], "first_at": r[2], "last_at": r[3], "enrollments": r[4]}
                for r in found
            }

        return await self.store.transaction(rows)

    async def allow(self, instance: str) -> bool:
        """Let `instance` enroll once more; False if it never enrolled."""

        def grant(db: Any) -> bool:
            db.execute(_CREATE)
            cursor = db.execute(
                "UPDATE attestations SET allowed = 1 WHERE instance = ?", (instance,)
            )
            return bool(cursor.rowcount)

        return await self.store.transaction(grant)


def allow_command(instance: str, out: IO[str]) -> Callable[[Store], Awaitable[int]]:
    """`maintenance-bridge fleet allow-attestation ARN`: exit 0 when allowed, 1 when the
    instance never enrolled (a typo, most likely)."""

    async def run(store: Store) -> int:
        if await StoreLedger(store).allow(instance):
            print(f"{instance} may enroll once more with its identity document", file=out)
            return 0
        print(f"{instance} never enrolled: nothing to allow", file=out)
        return 1

    return run
