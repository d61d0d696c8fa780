"""The fleet service: the store, the sources and the API on one listener, until stopped.

Start order: open the store (its tables created or upgraded, `bridge.fleet.migrations`),
start every source, listen, then prune by the retention policy (`bridge.fleet.retention`);
a listener that cannot bind or a store that cannot open stops the start with a message.
Stop order is the reverse, so no source commits into a closed store.
"""

from __future__ import annotations

import importlib
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from bridge import __version__
from bridge.fleet.api import FleetApiRoutes
from bridge.fleet.auth import AccessGuard
from bridge.fleet.bus_config import EventHubsSourceConfig, PubsubSourceConfig
from bridge.fleet.config import FleetConfig, FleetStore, HttpSourceConfig
from bridge.fleet.connections import ConnectionGuard, connection_cap, raise_file_limit
from bridge.fleet.group_commit import GroupCommit
from bridge.fleet.identity.wiring import FleetIdentity
from bridge.fleet.ingest_log import ingest_log
from bridge.fleet.kafka_config import KafkaSourceConfig
from bridge.fleet.metrics import IngestStats
from bridge.fleet.retention import Prunable, Pruner
from bridge.fleet.sources.base import Ingestor, Source
from bridge.fleet.sources.http import PATH, HttpSource
from bridge.fleet.sqlite_store import SqliteStore
from bridge.fleet.store import Store, StoreError
from bridge.fleet.web.routes import DashboardRoutes
from bridge.fleet.web.signin import SignInRoutes
from bridge.infra import tracing
from bridge.infra.tls import CertificateError, ReloadingContext, server_context

log = logging.getLogger("bridge.fleet")


class FleetListenerError(Exception):
    """The fleet listener could not bind its address."""


def build_store(url: str, *, read_only: bool = False) -> Store:
    """The store of `[fleet.store] url`: SQLite built in; PostgreSQL when its module is there.
    `read_only` (the read commands) opens an existing store and never creates one."""
    if url.startswith("sqlite://"):
        return SqliteStore(FleetStore(url=url).sqlite_path(), read_only=read_only)
    try:
        module = importlib.import_module("bridge.fleet.postgres_store")
    except ImportError as exc:
        raise StoreError(f"the PostgreSQL store is not available here: {exc}") from None
    store: Store = module.PostgresStore(url, read_only=read_only)
    return store


def build_source(
    config: Any, guard: AccessGuard | None = None, identity: FleetIdentity | None = None
) -> Source:
    """The source of one `[[fleet.sources]]` entry (bus sources add their type here); the
    http source checks its bearer tokens against `guard`'s credentials; every source gets
    its identity gate when `[fleet.identity]` is configured."""
    gate = identity.gate(config.name, config.identity) if identity is not None else None
    if isinstance(config, HttpSourceConfig):
        return HttpSource(config, guard, gate)
    if isinstance(config, PubsubSourceConfig):
        from bridge.fleet.sources.pubsub import PubsubSource

        return PubsubSource(config, gate)
    if isinstance(config, EventHubsSourceConfig):
        from bridge.fleet.sources.eventhubs import EventHubsSource

        return EventHubsSource(config, gate)
    if isinstance(config, KafkaSourceConfig):
        from bridge.fleet.sources.kafka import KafkaSource

        return KafkaSource(config, gate)
    raise ValueError(f"unknown source type {config.type!r}")


class FleetService:
    """Everything `maintenance-bridge fleet` runs (see the module docstring)."""

    def __init__(self, config: FleetConfig, store: Store | None = None) -> None:
        self.config = config
        self.store = store or build_store(config.store.url)
        self.stats = IngestStats()
        grouping = config.ingest
        self.group = GroupCommit(
            self.store,
            max_events=grouping.group_events,
            max_wait=grouping.group_wait,
            max_queued=grouping.max_queued,
            max_requests=grouping.max_requests,
            stats=self.stats.group,
        )
        self.ingestor = Ingestor(self.store, self.stats, group=self.group)
        #: Retention's passes (None for a store that cannot prune, e.g. a test's stand-in).
        self.pruner = (
            Pruner(self.store, config.retention) if isinstance(self.store, Prunable) else None
        )
        self.guard = AccessGuard(
            config.auth,
            loopback=config.listener.loopback,
            ingest_tokens=[
                (f"{s.name}.token", s.token)
                for s in config.sources
                if isinstance(s, HttpSourceConfig) and s.token is not None
            ],
            stats=self.stats.auth,
        )
        self.identity = (
            FleetIdentity(config.identity, self.store, self.stats) if config.identity else None
        )
        self.sources = [
            build_source(source, self.guard, self.identity) for source in config.sources
        ]
        self.api = FleetApiRoutes(self.store, config.api, self.stats, self.sources)
        self.url = ""
        #: The listener's certificate files while it serves TLS.
        self.tls: ReloadingContext | None = None

    def application(self) -> web.Application:
        limits = [s.max_body for s in self.config.sources if isinstance(s, HttpSourceConfig)]
        http = [s.name for s in self.sources if isinstance(s, HttpSource)]
        ingest = {PATH: http[0]} if http else {}
        app = web.Application(
            client_max_size=max(limits, default=1024 * 1024),
            middlewares=[self.api.errors, self.guard.middleware, ingest_log(ingest)],
        )
        for source in self.sources:
            if isinstance(source, HttpSource):
                source.add_routes(app)
        if self.identity is not None:
            self.identity.add_routes(app)  # POST /v1/enroll
        self.api.add_routes(app)
        DashboardRoutes(self.store, self.config.api.eligible_horizon).add_routes(app)
        SignInRoutes(self.guard).add_routes(app)
        return app

    def _tls_context(self) -> ssl.SSLContext | None:
        """The listener's TLS context (None: plain HTTP), re-reading the certificate files
        when they change; `tls` keeps what it loaded."""
        files = self.config.listener.tls_files()
        if files is None:
            return None
        try:
            self.tls = ReloadingContext(files, server_context, "fleet listener")
        except CertificateError as exc:
            raise FleetListenerError(f"cannot serve TLS: {exc}") from exc
        return self.tls.server_context()

    def _tls_summary(self) -> str:
        if self.tls is None:
            return ""
        shown = self.tls.certificate.describe() if self.tls.certificate else "?"
        mutual = (
            f"; mutual TLS: clients need a certificate from {self.tls.files.ca}"
            if self.tls.files.ca is not None
            else ""
        )
        return f" with {shown}{mutual}"

    @asynccontextmanager
    async def running(self) -> AsyncIterator[FleetService]:
        """Serve while the block runs; `url` is the listener's base URL."""
        await self.store.open()
        tracing.configure(self.config.tracing, __version__)  # bridge/infra/tracing.py
        started: list[Source] = []
        # lingering_time=0: a request refused from its headers (bridge.fleet.auth) has its
        # connection closed after the answer, instead of aiohttp reading and dropping the
        # rest of its body for 10 s; every handler that wants a body reads all of it.
        runner = web.AppRunner(self.application(), access_log=None, lingering_time=0)
        try:
            for source in self.sources:
                await source.start(self.ingestor)
                started.append(source)
            await runner.setup()
            # Bounded connections (bridge.fleet.connections): a private attribute, since
            # aiohttp takes no protocol factory of one's own; the guard forwards the rest.
            guard = ConnectionGuard(runner.server, connection_cap(raise_file_limit()))
            runner._server = guard  # type: ignore[assignment]  # it is the Server, guarded
            listener = self.config.listener
            site = web.TCPSite(
                runner, listener.host, listener.port, ssl_context=self._tls_context()
            )
            try:
                await site.start()
            except OSError as exc:
                raise FleetListenerError(
                    f"cannot listen on {listener.host}:{listener.port}: {exc.strerror or exc} "
                    "(set [fleet.listener] port)"
                ) from exc
            server: Any = site._server
            host, port = server.sockets[0].getsockname()[:2]
            scheme = "https" if self.tls is not None else "http"
            self.url = f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
            log.info(
                "fleet service listening on %s%s (sources: %s; store: %r)",
                self.url,
                self._tls_summary(),
                ", ".join(s.name for s in self.sources) or "none",
                self.store,
            )
            if self.pruner is not None:
                self.pruner.start()  # after the listener: a first pass never delays the start
            yield self
        finally:
            if self.pruner is not None:
                await self.pruner.stop()
            await runner.cleanup()
            for source in reversed(started):
                await source.stop()
            await self.group.close()
            tracing.shutdown()
            await self.store.close()
