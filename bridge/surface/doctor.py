"""`maintenance-bridge doctor`: every precondition of a working bridge, checked once, explained.

Each check gives a verdict and, when something is wrong, the fix. Nothing here retries
forever (unlike the running bridge): every network step has a deadline, so the doctor
always finishes and says what it could not reach. It reads the same configuration as `run`
and goes through the same code (detection, metadata client, watcher, sinks), so what the
doctor sees is what the bridge will see.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Final, TypeVar

from bridge.config import Config
from bridge.contract import ProviderName
from bridge.infra import port_holder
from bridge.infra.findings import Finding as Finding
from bridge.infra.findings import Verdict as Verdict
from bridge.infra.findings import dns_fix
from bridge.pipeline.model import Instance
from bridge.pipeline.spool import DB_NAME, integrity
from bridge.pipeline.watchers.base import Watcher
from bridge.sinkapi import Ok, Reject, Sink

T = TypeVar("T")


class Doctor:
    """Runs the checks in order; later checks are skipped when what they need failed."""

    def __init__(self, config: Config, config_path: Path | None, timeout: float = 10.0):
        self.config = config
        self.config_path = config_path
        self.timeout = timeout
        self.findings: list[Finding] = []
        self.instance: Instance | None = None

    def note(self, check: str, verdict: Verdict, detail: str, fix: str = "") -> None:
        self.findings.append(Finding(check, verdict, detail, fix))

    async def _bounded(self, step: Callable[[], Awaitable[T]]) -> T:
        return await asyncio.wait_for(step(), self.timeout)

    async def run(self, send_test_event: bool = False) -> list[Finding]:
        where = str(self.config_path) if self.config_path else "built-in defaults + environment"
        self.note("configuration", "ok", f"{where}: valid, {len(self.config.sinks)} sink(s)")
        proxies = [
            name for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY") if os.environ.get(name)
        ]
        if proxies:
            self.note(
                "proxy",
                "ok",
                f"{', '.join(proxies)} set: ignored for metadata requests (they never use a proxy)",
            )
        provider = await self._detect()
        if provider is not None:
            watcher = self._watcher(provider)
            try:
                await self._metadata(provider)
                await self._identity_and_notices(watcher)
            finally:
                await watcher.aclose()
        if self.config.coordination is not None:
            await self._coordination()
        self._state()
        await self._listener()
        await self._sinks(send_test_event)
        return self.findings

    async def _detect(self) -> ProviderName | None:
        from bridge.providers.detect import DetectionError, detect

        source = self.config.source
        try:
            provider = await detect(source)
        except DetectionError as exc:
            self.note(
                "cloud",
                "fail",
                str(exc),
                "run on a GCE, Azure or AWS VM, or set source.provider and the metadata URL "
                "(maintenance-bridge simulate serves them locally)",
            )
            return None
        how = "detected" if source.provider == "auto" else "set in source.provider"
        self.note("cloud", "ok", f"{provider} ({how})")
        return provider

    def _watcher(self, provider: ProviderName) -> Watcher:
        from bridge.runner import watcher_factory

        return watcher_factory(self.config, provider, retry_initial=0.2, retry_max=1.0)(None)

    async def _metadata(self, provider: ProviderName) -> None:
        """One plain request to the key the bridge watches, with the vendor's header rules."""
        from bridge.providers import plugins

        self.findings.append(await plugins.get(provider).check_metadata(self.config, self.timeout))

    async def _identity_and_notices(self, watcher: Watcher) -> None:
        try:
            instance = await self._bounded(watcher.identify)
        except TimeoutError:
            causes = ", ".join(f"{c} x{n}" for c, n in sorted(watcher.stats.errors.items()))
            self.note(
                "identity",
                "fail",
                f"no usable answer in {self.timeout:g}s ({causes or 'no answer'})",
                "see the metadata check above",
            )
            return
        self.instance = instance
        where = instance.zone or instance.location or "?"
        self.note(
            "identity",
            "ok",
            f"{instance.name} (id {instance.id}, {where}) → source {instance.source}",
        )
        try:
            notices = await self._bounded(watcher.snapshot)
        except TimeoutError:
            self.note("notices", "fail", f"could not read the notices in {self.timeout:g}s")
            return
        if notices:
            listed = "; ".join(f"{n.kind.value} {n.status.value} ({n.notice_id})" for n in notices)
            self.note("notices", "warn", f"{len(notices)} in force now: {listed}")
        else:
            self.note("notices", "ok", "none in force now")

    async def _coordination(self) -> None:
        """Can the budget's engine be reached, and who holds this VM's group's slots?"""
        from bridge.actions.coordination import doctor

        self.findings += await doctor.check(self.config, self.instance, self.timeout)

    def _state(self) -> None:
        directory = self.config.state.dir
        existing = directory
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not os.access(existing, os.W_OK):
            self.note(
                "state",
                "fail",
                f"{directory} is not writable by this user",
                "create it for the bridge's user (systemd: StateDirectory=), or set state.dir",
            )
            return
        free = shutil.disk_usage(existing).free
        verdict: Verdict = "ok" if free > 64 * 1024 * 1024 else "warn"
        spool = directory / DB_NAME
        self.note(
            "state",
            verdict,
            f"{directory} writable, {free / 2**30:.1f} GiB free"
            + ("" if spool.exists() else " (no spool yet)"),
            "" if verdict == "ok" else "the spool needs disk to keep notices through an outage",
        )
        if spool.exists():
            found = integrity(spool)
            if found == "ok":
                self.note("spool", "ok", f"{spool}: SQLite quick_check ok")
            else:
                self.note(
                    "spool",
                    "fail",
                    f"{spool} is damaged: {found}",
                    f"stop the bridge, move it aside (mv {spool} {spool}.damaged) and start "
                    "again; recover its notices from the moved file with sqlite3's .recover",
                )

    async def _listener(self) -> None:
        """Is the configured address free? If not, is it a bridge answering there, or which
        other program holds it (so that the user knows what to stop or where to move)?"""
        settings = self.config.listener
        if not settings.enabled:
            self.note("listener", "ok", "disabled (no metrics, probes or status API)")
            return
        address = f"{settings.host}:{settings.port}"
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(settings.host, settings.port), self.timeout
            )
        except (OSError, TimeoutError):
            self.note("listener", "ok", f"{address} is free for the bridge")
            return
        writer.close()
        answer, is_bridge = await self._healthz(settings.host, settings.port)
        holder = port_holder.listening_process(settings.port)
        if is_bridge:
            who = f", {holder}" if holder else ""
            self.note(
                "listener", "ok", f"{address}: a bridge is already running here ({answer}{who})"
            )
            return
        self.note(
            "listener",
            "fail",
            f"{address} is taken by another program: "
            + (str(holder) if holder else "which one cannot be told here (try: ss -ltnp as root)")
            + f"; /healthz: {answer}",
            "stop that program, or set listener.port to a free port",
        )

    async def _healthz(self, host: str, port: int) -> tuple[str, bool]:
        """What `GET /healthz` answered there, and whether it is a bridge's answer (the JSON
        report of `bridge.surface.routes`: a status and a `process` check), not just any 200."""
        from bridge import __version__
        from bridge.infra.http1 import Http1Client, TransportError

        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        client = Http1Client(
            f"http://{authority}/",
            timeout=self.timeout,
            user_agent=f"maintenance-bridge/{__version__} doctor",
        )
        try:
            response = await client.request("GET", "healthz")
        except TransportError as exc:
            return f"no HTTP answer ({exc})", False
        finally:
            await client.aclose()
        answer = f"HTTP {response.status}"
        try:
            body = json.loads(response.body)
            checks = body.get("checks") if isinstance(body, dict) else None
            first = checks[0] if isinstance(checks, list) and checks else None
            is_bridge = (
                response.status in (200, 503)
                and body.get("status") in ("ok", "failing")
                and isinstance(first, dict)
                and first.get("name") == "process"
            )
        except (ValueError, AttributeError):
            is_bridge = False
        return answer, is_bridge

    async def _sinks(self, send_test_event: bool) -> None:
        from bridge import sink_registry

        names = self.config.sink_names()
        if not names:
            self.note("sinks", "warn", "none configured: `run` prints events to stdout")
            return
        for sink_config, name in zip(self.config.sinks, names, strict=True):
            try:
                sink = sink_registry.create(sink_config, name)
            except Exception as exc:  # a sink that cannot even be built: say why, go on
                self.note(f"sink {name}", "fail", f"cannot be created: {exc}", "check its settings")
                continue
            try:
                await self._sink(sink, send_test_event)
            finally:
                await sink.close(self.timeout)

    async def _sink(self, sink: Sink, send_test_event: bool) -> None:
        from bridge.pipeline.sink_checks import sink_health

        self._client_certificate(sink)
        health = await sink_health(sink, self.timeout)
        # The HTTP client says "cannot resolve <host> (DNS)" (`NameResolutionError`).
        fix = dns_fix(None) if not health.ok and "(DNS)" in health.detail else ""
        self.note(f"sink {sink.name}", "ok" if health.ok else "fail", health.detail, fix)
        if send_test_event:
            await self._send_test_event(sink)

    def _client_certificate(self, sink: Sink) -> None:
        """The certificate a sink presents (mutual TLS): its file, names and dates."""
        files = sink.client_certificate()
        if files is None or files.certificate is None:
            return
        check = f"sink {sink.name} certificate"
        problem = files.problem()
        if problem is not None:
            self.note(
                check,
                "fail",
                f"client {problem}",
                "renew the sink's client_cert and client_key (replace the files): the running "
                "bridge uses them from its next connection on, no restart needed",
            )
        elif files.certificate.expires_soon():
            info = files.certificate.describe()
            self.note(check, "warn", f"{info} expires soon", "renew client_cert and client_key")
        else:
            self.note(check, "ok", f"presents {files.certificate.describe()}")

    async def _send_test_event(self, sink: Sink) -> None:
        """Publish one `io.maintenancebridge.test` event straight to the sink (not spooled)."""
        from bridge.actions.audit import test_event

        check = f"sink {sink.name} test event"
        if self.instance is None:
            self.note(check, "skip", "needs the VM identity (see above)")
            return
        event = test_event(self.instance, "sent by maintenance-bridge doctor --send-test-event")
        try:
            result = await self._bounded(lambda: sink.publish([event]))
        except TimeoutError:
            self.note(check, "fail", f"not accepted in {self.timeout:g}s")
            return
        except Exception as exc:
            self.note(check, "fail", f"publish raised {type(exc).__name__}: {exc}")
            return
        if isinstance(result, Ok):
            self.note(check, "ok", f"accepted {event.get_type()} id {event.get_id()}")
        else:
            kind = "refused for good" if isinstance(result, Reject) else "not accepted"
            self.note(check, "fail", f"{kind}: {result.reason}")


SYMBOL: dict[Verdict, str] = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
#: At most this many distinct log lines under the table (the checks' own findings say more).
MAX_LOGGED: Final = 20


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def logs_kept_for_the_report(keep: bool = True) -> Iterator[list[logging.LogRecord]]:
    """The warnings the checks log (a metadata retry, a sink's complaint), kept for the end
    of the report instead of written to stderr meanwhile: as JSON lines (stderr is not a
    terminal) they landed between the table's lines. `keep=False` (`-v`) logs as usual."""
    if not keep:
        yield []
        return
    root = logging.getLogger()
    kept, saved = _Kept(), root.handlers[:]
    root.handlers[:] = [kept]
    try:
        yield kept.records
    finally:
        root.handlers[:] = saved


def _logged(records: list[logging.LogRecord]) -> list[str]:
    counts: Counter[str] = Counter(
        f"{r.levelname} {r.name}: {r.getMessage()}".splitlines()[0] for r in records
    )
    if not counts:
        return []
    lines = ["", f"logged while checking ({len(records)} line(s); -v shows them as they come):"]
    for text, count in list(counts.items())[:MAX_LOGGED]:
        lines.append(f"  {text}" + (f" (x{count})" if count > 1 else ""))
    if len(counts) > MAX_LOGGED:
        lines.append(f"  ... and {len(counts) - MAX_LOGGED} more")
    return lines


def render(findings: list[Finding], logged: list[logging.LogRecord] | None = None) -> str:
    """A plain table: one line per check, and the fix under any line that needs one."""
    width = max((len(f.check) for f in findings), default=5)
    lines = [f"{'CHECK'.ljust(width)}  {'RESULT':6}  DETAIL"]
    for finding in findings:
        first, *rest = finding.detail.splitlines() or [""]
        lines.append(f"{finding.check.ljust(width)}  {SYMBOL[finding.verdict]:6}  {first}")
        lines.extend(f"{''.ljust(width)}  {'':6}  {line.strip()}" for line in rest)
        if finding.fix:
            lines.append(f"{''.ljust(width)}  {'':6}  fix: {finding.fix}")
    failed = sum(f.verdict == "fail" for f in findings)
    warned = sum(f.verdict == "warn" for f in findings)
    lines.append("")
    lines.append(
        "all checks passed"
        if not failed and not warned
        else f"{failed} check(s) failed, {warned} warning(s)"
    )
    lines += _logged(logged or [])
    return "\n".join(lines) + "\n"
