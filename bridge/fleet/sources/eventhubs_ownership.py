"""Event Hubs partitions shared by fleet replicas, their ownership kept in the fleet store.

With `share_partitions = true` the `eventhubs` source hands the official consumer this
`CheckpointStore` (the SDK's protocol for load balancing, which Azure's blob checkpoint store
implements with blob ETags): every `load_balancing_interval` each replica lists who owns
which partition, and claims unowned or expired ones (an owner that has not renewed for six
intervals, e.g. a replica killed with -9) with a compare-and-set on the row's `etag`, so of
two replicas claiming one partition exactly one wins. The rows live in `partition_owners`
(schema step 4, `bridge.fleet.migrations`), in the database the replicas already share.

Checkpoints stay where they were: each batch's position commits in the same transaction as
its events (`bridge.fleet.store`), so `update_checkpoint` does nothing and
`list_checkpoints` reads them back, as the position a newly claimed partition starts after.
A replica that takes a partition over therefore resumes right after the last committed
batch of the replica that lost it: nothing lost, and at most the batch that replica had not
committed is read again (the store's (source, id) key makes it a duplicate).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

from azure.eventhub.aio import CheckpointStore

from bridge.fleet.store import Store

_KEY = "namespace = ? AND eventhub = ? AND consumer_group = ? AND partition_id = ?"


class StoreOwnership(CheckpointStore):
    """The SDK's checkpoint store over the fleet store (see the module docstring)."""

    def __init__(self, store: Store, source: str) -> None:
        self.store = store
        self.source = source

    async def list_ownership(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **_: Any
    ) -> Iterable[dict[str, Any]]:
        rows = await self.store.transaction(
            lambda db: db.execute(
                "SELECT partition_id, owner_id, last_modified, etag FROM partition_owners "
                "WHERE namespace = ? AND eventhub = ? AND consumer_group = ?",
                (fully_qualified_namespace, eventhub_name, consumer_group),
            ).fetchall()
        )
        return [
            {
                "fully_qualified_namespace": fully_qualified_namespace,
                "eventhub_name": eventhub_name,
                "consumer_group": consumer_group,
                "partition_id": str(pid),
                "owner_id": str(owner),
                "last_modified_time": float(modified),
                "etag": str(etag),
            }
            for pid, owner, modified, etag in rows
        ]

    async def claim_ownership(
        self, ownership_list: Iterable[dict[str, Any]], **_: Any
    ) -> Iterable[dict[str, Any]]:
        claims = [dict(ownership) for ownership in ownership_list]
        return await self.store.transaction(lambda db: [c for c in claims if _claim(db, c)])

    async def update_checkpoint(self, checkpoint: dict[str, Any], **_: Any) -> None:
        """Nothing: a batch's position commits with its events."""

    async def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **_: Any
    ) -> Iterable[dict[str, Any]]:
        positions = await self.store.transaction(
            lambda db: db.execute(
                "SELECT part, position FROM checkpoints WHERE ingest = ?", (self.source,)
            ).fetchall()
        )
        return [
            {
                "fully_qualified_namespace": fully_qualified_namespace,
                "eventhub_name": eventhub_name,
                "consumer_group": consumer_group,
                "partition_id": str(part),
                "sequence_number": int(position),
                # The SDK starts a claimed partition at "offset": an int is a sequence
                # number, read after it (starting_position_inclusive is false).
                "offset": int(position),
            }
            for part, position in positions
        ]


def _claim(db: Any, claim: dict[str, Any]) -> bool:
    """Compare-and-set one ownership row: insert it if nobody ever owned the partition,
    else update it only if its etag is still the one the claimer listed."""
    key = (
        claim["fully_qualified_namespace"],
        claim["eventhub_name"],
        claim["consumer_group"],
        claim["partition_id"],
    )
    now, etag = time.time(), uuid.uuid4().hex
    if claim.get("etag") is None:
        cursor = db.execute(
            "INSERT INTO partition_owners (namespace, eventhub, consumer_group, partition_id, "
            "owner_id, last_modified, etag) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (*key, claim["owner_id"], now, etag),
        )
    else:
        cursor = db.execute(
            "UPDATE partition_owners SET owner_id = ?, last_modified = ?, etag = ? "  # noqa: S608
            f"WHERE {_KEY} AND etag = ?",
            (claim["owner_id"], now, etag, *key, claim["etag"]),
        )
    if cursor.rowcount != 1:
        return False
    claim["etag"], claim["last_modified_time"] = etag, now
    return True
