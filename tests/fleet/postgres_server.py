"""A real PostgreSQL server for the fleet store tests, from the machine's own binaries.

`initdb` makes a cluster in a temporary directory and `pg_ctl` starts it on a free loopback
port (and a Unix socket in the same directory), trust authentication, fsync off (the tests
never crash the machine). PostgreSQL refuses to run as root, so under root both run as
`nobody` through `runuser`, which owns the directory. Each test gets a database of its own
(`postgres_url`), so tests never see each other's rows.

Without the binaries the tests skip, except under `CI=true`, where the harness first installs
Debian's `postgresql` package (as root) and fails if there still are none (as the other
real-server harnesses, e.g. tests/sinks/pubsub_emulator.py, fail under CI).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import free_port, running_as_root

USER = "fleet"
INSTALL_HELP = (
    "PostgreSQL's server binaries (initdb, pg_ctl, postgres) are needed for the fleet's "
    "PostgreSQL store tests: `apt-get install postgresql` (Debian keeps them in "
    "/usr/lib/postgresql/VERSION/bin, found there too), and the `postgres` extra "
    "(psycopg) installed."
)


def find_bindir() -> Path | None:
    """The directory holding initdb and pg_ctl: on PATH, else Debian's versioned folders."""
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(os.path.realpath(initdb)).parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "initdb").is_file():
            return Path(candidate)
    return None


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass
class PostgresServer:
    """One cluster in `directory`, listening on 127.0.0.1:`port`."""

    bindir: Path
    directory: Path
    port: int

    def _run(self, *args: str) -> None:
        command = [*args]
        if running_as_root():
            command = ["runuser", "-u", "nobody", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed:\n{done.stdout}\n{done.stderr}")

    def start(self) -> None:
        data = self.directory / "data"
        if not data.exists():
            self._run(
                str(self.bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                USER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            )
        options = (
            f"-k {self.directory} -p {self.port} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=200"
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(self.directory / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError):
            data = str(self.directory / "data")
            self._run(str(self.bindir / "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new, empty database; its URL."""
        import psycopg

        name = f"fleet_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def apt_install() -> Path | None:
    """Under CI=true as root on Debian: install the server package, then look again (the
    machine's own binaries, as the brief of these tests says; never a download of our own)."""
    if not _in_ci() or not running_as_root() or shutil.which("apt-get") is None:
        return None
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "postgresql"],
    ):
        subprocess.run(command, env=environment, capture_output=True, check=False, timeout=900)
    return find_bindir()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bindir = find_bindir() or apt_install()
    try:
        import psycopg  # noqa: F401
    except ImportError:
        bindir = None
    if bindir is None or (running_as_root() and shutil.which("runuser") is None):
        if _in_ci():
            pytest.fail(INSTALL_HELP)
        pytest.skip(INSTALL_HELP)
    directory = Path(tempfile.mkdtemp(prefix="fleet-postgres-"))
    if running_as_root():
        shutil.chown(directory, "nobody")
    server = PostgresServer(bindir, directory, free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The URL of a fresh database on the session's server."""
    return postgres_server.create_database()


@pytest.fixture
async def postgres_store(postgres_url: str) -> AsyncIterator[Any]:
    """An open `PostgresStore` on a fresh database (closed after the test)."""
    from bridge.fleet.postgres_store import PostgresStore

    store = PostgresStore(postgres_url)
    await store.open()
    yield store
    await store.close()
