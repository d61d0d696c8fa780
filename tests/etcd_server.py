"""A real etcd server for the coordination tests: Debian's `etcd-server`, on loopback.

One single-member cluster per test, with free ports and a temporary data directory, run in
its own process group so it can be stopped, killed with -9 and restarted on the same ports
and data (what the outage tests need). When the binary is missing the set-up installs the
package with apt-get if it runs as root; otherwise the tests skip, and fail under `CI=true`.

`Blackhole` is a TCP proxy in front of it that a test can cut silently (a partition).

`history` reads etcd's own record: the keys under a prefix at every revision, which is
how the tests check that no more than `budget` slots were ever held at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bridge.infra import platform
from tests.support import free_port, running_as_root

INSTALL_HELP = (
    "etcd is needed for the coordination tests: install Debian's etcd-server package "
    "(`apt-get install etcd-server`) or put an `etcd` 3.4+ binary on PATH."
)
_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def find_etcd() -> str | None:
    """The etcd binary; installs Debian's etcd-server when missing and possible (root)."""
    found = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    if found or not running_as_root() or shutil.which("apt-get") is None:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "etcd-server"]):
        result = subprocess.run(command, env=env, capture_output=True, check=False, timeout=600)
        if result.returncode != 0:
            return None
    return shutil.which("etcd") or None


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")


@dataclass
class EtcdServer:
    """One etcd process; `stop`, `kill` and `start` again keep its ports and data."""

    binary: str
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    data_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="etcd-")))
    _proc: subprocess.Popen[bytes] | None = None
    _tls_flags: list[str] = field(default_factory=list)
    #: Once `enable_auth` ran: root's token, sent with the helper's own calls.
    _token: str | None = None
    #: With TLS (see `with_tls`): the trusted CAs, and the client certificate and key the
    #: helper itself presents.
    tls: tuple[Path, Path, Path] | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    def with_tls(self, server: tuple[Path, Path], client: tuple[Path, Path]) -> None:
        """Serve TLS with `server` (cert, key) and require client certificates; `server` and
        `client` are self-signed, each trusted by the other side (restart to apply)."""
        trusted = self.data_dir / "trusted.pem"
        trusted.write_bytes(server[0].read_bytes() + client[0].read_bytes())
        self.tls = (trusted, *client)
        self._tls_flags = [
            f"--cert-file={server[0]}",
            f"--key-file={server[1]}",
            "--client-cert-auth",
            f"--trusted-ca-file={trusted}",
        ]

    def _context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        trusted, cert, key = self.tls
        context = ssl.create_default_context(cafile=str(trusted))
        context.load_cert_chain(str(cert), str(key))
        return context

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 30.0) -> None:
        assert not self.running
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = (self.data_dir / "etcd.log").open("ab")
        with log:
            self._proc = subprocess.Popen(
                [
                    self.binary,
                    "--name=test",
                    f"--data-dir={self.data_dir / 'data'}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=test={peer}",
                    "--log-level=error",
                    *self._tls_flags,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                **platform.current().spawn_options(),
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            with contextlib.suppress(OSError, ValueError):
                if self.call("kv/range", {"key": b64("/")}).get("header"):
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"etcd did not start within {timeout}s on {self.url}")

    def _end(self, *, hard: bool) -> None:
        """End etcd's process tree: asked to stop (SIGTERM) or killed outright (SIGKILL)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        tree = platform.current().contain(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            tree.kill() if hard else tree.terminate()
        proc.wait(20)
        tree.close()

    def stop(self) -> None:
        self._end(hard=False)

    def kill(self) -> None:
        self._end(hard=True)

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One gateway call with the standard library (independent of the bridge's client)."""
        headers = {"Authorization": self._token} if self._token else {}
        request = urllib.request.Request(  # noqa: S310 (a loopback http:// url we built)
            f"{self.url}/v3/{path}", data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        with urllib.request.urlopen(  # noqa: S310
            request, timeout=5, context=self._context()
        ) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    def enable_auth(self, user: str, password: str, prefix: str) -> None:
        """Turn authentication on: `root` (password `root`) and `user`, who may read and
        write the keys under `prefix` only."""
        self.call("auth/user/add", {"name": "root", "password": "root"})
        self.call("auth/role/add", {"name": "root"})
        self.call("auth/user/grant", {"user": "root", "role": "root"})
        self.call("auth/user/add", {"name": user, "password": password})
        self.call("auth/role/add", {"name": user})
        end = bytearray(prefix.encode())
        end[-1] += 1
        permission = {
            "permType": "READWRITE",
            "key": b64(prefix),
            "range_end": base64.b64encode(bytes(end)).decode(),
        }
        self.call("auth/role/grant", {"name": user, "perm": permission})
        self.call("auth/user/grant", {"user": user, "role": user})
        self.call("auth/enable", {})
        self._token = self.call("auth/authenticate", {"name": "root", "password": "root"})["token"]

    def keys(self, prefix: str, revision: int = 0) -> dict[str, str]:
        """key -> value under `prefix`, now or at `revision`."""
        end = bytearray(prefix.encode())
        end[-1] += 1
        body: dict[str, Any] = {
            "key": b64(prefix),
            "range_end": base64.b64encode(bytes(end)).decode(),
        }
        if revision:
            body["revision"] = str(revision)
        kvs = self.call("kv/range", body).get("kvs") or []
        return {
            base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
            for kv in kvs
        }

    def leases(self, prefix: str) -> dict[str, int]:
        """key -> the id of the lease it is attached to, for the keys under `prefix`."""
        end = bytearray(prefix.encode())
        end[-1] += 1
        body = {"key": b64(prefix), "range_end": base64.b64encode(bytes(end)).decode()}
        kvs = self.call("kv/range", body).get("kvs") or []
        return {base64.b64decode(kv["key"]).decode(): int(kv.get("lease", 0)) for kv in kvs}

    def lease_alive(self, lease: int) -> bool:
        return int(self.call("lease/timetolive", {"ID": str(lease)}).get("TTL", -1)) > 0

    def revision(self) -> int:
        return int(self.call("kv/range", {"key": b64("/")})["header"]["revision"])

    def history(self, prefix: str) -> list[dict[str, str]]:
        """The keys under `prefix` at every revision of the store (it is never compacted)."""
        return [self.keys(prefix, rev) for rev in range(1, self.revision() + 1)]


class Blackhole:
    """A TCP proxy to etcd that the test controls: `cut()` stops every byte in both
    directions, connections held open (as a silent network partition does), new ones
    accepted and left silent too."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.open = asyncio.Event()
        self.open.set()
        self.url = ""
        self._server: asyncio.Server | None = None
        self._closing = False
        self._writers: set[asyncio.StreamWriter] = set()

    def cut(self) -> None:
        self.open.clear()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                await self.open.wait()  # cut: hold the bytes (and the connection) for ever
                if self._closing:
                    break
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        await self.open.wait()
        if self._closing:
            writer.close()
            return
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self.target_port
        )
        self._writers.add(upstream_writer)
        await asyncio.gather(
            self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer)
        )

    async def __aenter__(self) -> Blackhole:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self._closing = True
        self.open.set()  # wakes every held pipe, which then ends
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    """A fresh etcd for one test (skipped without etcd, failing under CI=true)."""
    binary = find_etcd()
    if binary is None:
        if _CI:
            pytest.fail(INSTALL_HELP)
        pytest.skip(INSTALL_HELP)
    server = EtcdServer(binary)
    server.start()
    try:
        yield server
    finally:
        server.remove()
