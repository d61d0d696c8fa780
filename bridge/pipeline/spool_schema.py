"""The spool's tables and format, and the checks a spool passes before it is used.

The spool names its format and the release that last opened it (`FORMAT` in SQLite's
`PRAGMA user_version`, the version in the `meta` table), so a release never misreads state
it does not know: a spool of a newer format is refused at open with a line naming the
release that wrote it, never changed. Builds before 0.2.0 neither write nor read these
(docs/operations.md, "Rolling out"): their spools are format 0, which is format 1 without
the `meta` table.

A spool that is not a database, is damaged or cannot be opened is refused, never set aside
automatically: it may hold undelivered notices, and only an operator can decide that they
are lost. The error names the file and the way out.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Final

from bridge.infra.buildinfo import newer, version
from bridge.pipeline.spool_records import SpoolError

log = logging.getLogger("bridge.spool")

DB_NAME: Final = "spool.sqlite3"
#: The spool's format (SQLite's `PRAGMA user_version`). Raised only by a release whose
#: spool an older release would misread (a changed table, not a new one: older releases
#: leave tables they do not know alone); the release that raises it says so in CHANGELOG.md.
FORMAT: Final = 1
SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS events (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    id       TEXT NOT NULL UNIQUE,
    source   TEXT NOT NULL,
    type     TEXT NOT NULL,
    created  REAL NOT NULL,
    body     BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS pending (
    sink       TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;
-- Acknowledging looks events up by seq alone (is any sink still waiting for it?): without
-- this index each acknowledged event scanned the whole queue, quadratic in the backlog.
CREATE INDEX IF NOT EXISTS pending_by_seq ON pending (seq);
CREATE TABLE IF NOT EXISTS dead_letters (
    sink     TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    reason   TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    at       REAL NOT NULL,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS watcher_state (
    name    TEXT PRIMARY KEY,
    state   TEXT NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS actions (
    key     TEXT PRIMARY KEY,
    state   TEXT NOT NULL,
    detail  TEXT NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS in_force (
    key   TEXT PRIMARY KEY,
    body  BLOB NOT NULL
);
-- written_by: the version of the release that last opened the spool.
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


def integrity(path: Path) -> str:
    """SQLite's own `quick_check` of the spool at `path`, opened read-only: "ok" or what is
    wrong (for `doctor`, which must never change the spool a running bridge uses)."""
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return f"cannot open it: {exc}"
    try:
        rows = db.execute("PRAGMA quick_check").fetchall()
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        db.close()
    return "; ".join(str(row[0]) for row in rows[:5])


def written_by(db: sqlite3.Connection) -> str | None:
    """The version of the release that last opened the spool (None before 0.2.0)."""
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'written_by'").fetchone()
    except sqlite3.OperationalError:  # no meta table: a spool of a build before 0.2.0
        return None
    return str(row[0]) if row else None


def open_database(path: Path) -> sqlite3.Connection:
    """Open (or create) the spool at `path` after checking it; `SpoolError` with what to do
    when it cannot be used (see the module docstring)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise SpoolError(f"cannot open the spool {path}: {exc}") from exc
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=5000")
        (verdict,) = db.execute("PRAGMA quick_check").fetchone()
        if verdict != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {verdict}")
        _claim(db, path)
    except SpoolError:
        db.close()
        raise
    except (OSError, sqlite3.Error) as exc:
        db.close()
        raise SpoolError(
            f"cannot use the spool {path}: {exc}. If it is damaged, move it aside "
            f"(mv {path} {path}.damaged, with its -wal file if any) and start again "
            "with an empty spool; "
            "the notices it held can be read from the moved file with sqlite3's .recover"
        ) from exc
    return db


def _claim(db: sqlite3.Connection, path: Path) -> None:
    """Refuse a spool of a newer format (naming the release that wrote it); else create
    what is missing and record this release as the last to open it."""
    (found,) = db.execute("PRAGMA user_version").fetchone()
    writer = written_by(db)
    if found > FORMAT:
        raise SpoolError(
            f"the spool {path} was written by maintenance-bridge {writer or 'unknown'} "
            f"(spool format {found}); this is {version()}, which reads spool format "
            f"{FORMAT} at most. Upgrade again to {writer or 'that release'} or newer; nothing "
            "in the spool was changed"
        )
    if writer is not None and newer(writer, version()):
        log.warning(
            "the spool %s was last opened by maintenance-bridge %s, newer than this %s; "
            "its format %d is this release's, so it is used as it is",
            path,
            writer,
            version(),
            found,
        )
    db.executescript(SCHEMA)
    db.execute("BEGIN IMMEDIATE")
    db.execute(f"PRAGMA user_version = {FORMAT}")
    db.execute(
        "INSERT INTO meta (key, value) VALUES ('written_by', ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (version(),),
    )
    db.execute("COMMIT")
