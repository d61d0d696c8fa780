"""`fleet backup PATH` and `fleet restore PATH`: a consistent copy of a live SQLite store, and
putting one back.

The copy is SQLite's online backup API (`sqlite3.Connection.backup`) in one step: one read
transaction, so the copy is the store as of one commit, while the service keeps ingesting
beside it (WAL lets the writer go on). Copying the file instead would catch a half-written
page or miss what is still in the WAL. The copy is checked (`PRAGMA quick_check`) and made a
self-contained file (rollback journal, no -wal beside it) before it is renamed into place, so
PATH either is a whole backup or does not exist.

A restore must never swap the store under a running service (its open connections would go
on with pages that no longer match). SQLite's own locks tell: every connection of the
service holds a shared lock on the store file while it is open (WAL mode), so the restore
takes the store's exclusive lock without waiting (`locking_mode=EXCLUSIVE`, `BEGIN
EXCLUSIVE`), refuses when that fails, and keeps the lock until the copy is in. No lock file
can go stale: the kernel drops the locks with the process, however it ends.

PostgreSQL stores are backed up with PostgreSQL's tools (`pg_dump`, docs/operations.md).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from bridge.fleet.config import FleetConfig
from bridge.infra.platform import limits


class BackupError(Exception):
    """A backup or restore that was refused or failed; the message says why."""


def sqlite_path(config: FleetConfig, action: str) -> Path:
    """The SQLite store's file, or a refusal naming PostgreSQL's own tools."""
    if not config.store.url.startswith("sqlite://"):
        tool = "pg_dump" if action == "backup" else "pg_restore (or psql for a plain dump)"
        raise BackupError(
            f"the store is PostgreSQL: {action} it with {tool} (docs/operations.md, 'Backups')"
        )
    return config.store.sqlite_path()


def _check(db: sqlite3.Connection, what: Path) -> None:
    (result,) = db.execute("PRAGMA quick_check").fetchone()
    if result != "ok":
        raise BackupError(f"{what} is damaged: {result}")
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "events" not in tables:
        raise BackupError(f"{what} is not a fleet store (it has no events table)")


def backup(store: Path, target: Path) -> int:
    """Copy the live store to `target` (a new file); returns the copy's size in bytes."""
    if not store.is_file():
        raise BackupError(f"no fleet store at {store}")
    if target.exists():
        raise BackupError(f"{target} exists: back up to a new path")
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        source = sqlite3.connect(store, timeout=10)
        copy = sqlite3.connect(partial, isolation_level=None)
        try:
            source.backup(copy)  # pages=-1: all in one step, one snapshot of the store
            _check(copy, store)
            copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
        finally:
            copy.close()
            source.close()
        with open(partial, "rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, target)
    except sqlite3.Error as exc:
        raise BackupError(f"cannot back up {store} to {target}: {exc}") from exc
    except OSError as exc:
        raise BackupError(f"cannot write {target}: {exc.strerror or exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
    return target.stat().st_size


def restore(source: Path, store: Path) -> None:
    """Put the backup `source` in place of `store`, unless a running service has it open."""
    if not source.is_file():
        raise BackupError(f"no backup at {source}")
    try:
        backup_db = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise BackupError(f"cannot read {source}: {exc}") from exc
    created = not store.exists()
    try:
        try:
            _check(backup_db, source)
        except sqlite3.DatabaseError as exc:
            raise BackupError(f"{source} is not a fleet store backup: {exc}") from exc
        try:
            target = sqlite3.connect(store, isolation_level=None, timeout=0)
        except sqlite3.Error as exc:
            raise BackupError(f"cannot open {store}: {exc}") from exc
        try:
            target.execute("PRAGMA locking_mode=EXCLUSIVE")
            try:
                target.execute("BEGIN EXCLUSIVE")
                target.execute("COMMIT")  # the lock stays: exclusive locking mode
            except sqlite3.OperationalError as exc:
                raise BackupError(
                    f"the fleet store {store} is in use ({exc}): a running fleet service has "
                    "it open; stop the service, then restore"
                ) from exc
            try:
                backup_db.backup(target)
                target.execute("PRAGMA journal_mode=WAL")  # as the service keeps it
                _check(target, store)
            except sqlite3.Error as exc:
                raise BackupError(f"cannot restore {source} into {store}: {exc}") from exc
        finally:
            with contextlib.suppress(sqlite3.Error):
                target.close()
    finally:
        backup_db.close()
    if created:
        _owned_like_its_directory(store)


def _owned_like_its_directory(path: Path) -> None:
    """A store file root just created belongs to whoever owns its directory (the service's
    user: systemd's StateDirectory, the container's volume), or the service could not write
    it. Restoring into an existing file keeps that file's owner anyway."""
    limits.own_like_directory(path)
