"""Optional OpenTelemetry export: spans of each event's way, parented on its `traceparent`.

Every event carries the CloudEvents distributed-tracing extension (`traceparent`, W3C Trace
Context; `bridge.pipeline.events.traceparent`): one trace per maintenance, one parent span id
per transition. With `[tracing]` (the sidecar) or `[fleet.tracing]` (the fleet service)
configured, each program records spans for what it does with an event as children of that
parent and exports them over OTLP/HTTP (protobuf), so the sidecar's `poll`, `spool` and
`deliver` and the fleet's `ingest` and `commit` of one event land in one trace, whichever
process wrote them, with no context passed between them but the event itself.

Nothing here costs anything unless configured: the OpenTelemetry SDK is an extra
(`pip install 'maintenance-bridge[otel]'`) and is imported only by `configure` with settings
(start-up time matters: `python -X importtime -m bridge run` loads none of it otherwise).
Until then `record` returns at its first line. A configuration asking for tracing without
the extra installed logs one warning and runs untraced: a missing observability package must
never stop notices from being delivered.

Spans are recorded after the fact (`record(name, events, start)`: started at `start`, ended
now) rather than opened around the work: the hooks in the pipeline and the fleet stay one
statement each, and no span context leaks across the tasks that share an event loop.

Sampling is by trace id, the same decision in every process for the same ratio, so a
maintenance is traced on the sidecar and the fleet or on neither. It hashes the trace id:
the SDK's ratio sampler reads the id's low 64 bits, which in the UUID-derived ids of the
contract always start with the UUID variant bits `10`, and would keep all or nothing.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Final

import msgspec

from bridge.infra.secrets import Secret
from bridge.infra.validation import FieldError, HttpUrl

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger("bridge.tracing")

INSTALL_HINT: Final = "pip install 'maintenance-bridge[otel]'"
#: An attribute value as OpenTelemetry takes it.
Value = str | bool | int | float
#: One event as the hooks name it: its `traceparent` and its id. An event without a valid
#: `traceparent` (one spooled by a version before it) gets no span: a trace of its own
#: would follow nothing.
Traced = tuple[str | None, str]

_TRACEPARENT: Final = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_HEADER_NAME: Final = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")


class TracingSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """`[tracing]` / `[fleet.tracing]`: where the spans go and how many.

    `endpoint` is the collector's OTLP/HTTP traces URL (`http://collector:4318/v1/traces`);
    `headers` are sent with every export (an API key: a literal, `env:VAR` or `file:PATH`,
    held as a `Secret`, never logged); `sampling_ratio` is the share of maintenances traced
    (by trace id, see the module docstring); `timeout` bounds one export, in seconds.
    """

    endpoint: HttpUrl
    service_name: str = "maintenance-bridge"
    sampling_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 1.0
    headers: dict[str, Secret] = msgspec.field(default_factory=dict)
    timeout: Annotated[float, msgspec.Meta(gt=0, le=300)] = 10.0

    def __post_init__(self) -> None:
        if not self.service_name.strip():
            raise FieldError("service_name", "must not be empty")
        for name, secret in self.headers.items():
            if not _HEADER_NAME.fullmatch(name):
                raise FieldError("headers", f"{name!r} is not a valid HTTP header name")
            if any(c in secret.get_secret_value() for c in "\r\n\0"):
                raise FieldError("headers", f"the value of header {name!r} contains a line break")


class _Attributes(msgspec.Struct):
    traceparent: str | None = None


_ATTRIBUTES: Final = msgspec.json.Decoder(_Attributes)


def traceparent_of(body: bytes) -> str | None:
    """The `traceparent` of an event in structured JSON (None if it has none or is not one):
    for the hooks that hold the bytes only. Called only while tracing is configured."""
    try:
        return _ATTRIBUTES.decode(body).traceparent
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


class _Exporting:
    """The SDK's tracer provider with its OTLP/HTTP exporter (built only when configured)."""

    def __init__(self, settings: TracingSettings, version: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.provider: TracerProvider = TracerProvider(
            resource=Resource.create(
                {"service.name": settings.service_name, "service.version": version}
            ),
            sampler=_ratio_sampler(settings.sampling_ratio),
        )
        exporter = OTLPSpanExporter(
            endpoint=str(settings.endpoint),
            headers={name: value.get_secret_value() for name, value in settings.headers.items()},
            timeout=settings.timeout,
        )
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer: Tracer = self.provider.get_tracer("maintenance-bridge", version)

    def record(
        self, name: str, events: Iterable[Traced], start: float, attributes: Mapping[str, Value]
    ) -> None:
        end = time.time_ns()
        began = min(int(start * 1e9), end)
        for traceparent, event_id in events:
            parent = _parent(traceparent)
            if parent is None:
                continue
            span = self.tracer.start_span(
                name,
                context=parent,
                attributes={**attributes, "cloudevents.event_id": event_id},
                start_time=began,
            )
            span.end(end_time=end)


def _parent(traceparent: str | None) -> Context | None:
    """The remote parent a `traceparent` names; None when it is missing or not valid W3C
    Trace Context (version ff, an all-zero id)."""
    from opentelemetry import trace

    found = _TRACEPARENT.fullmatch(traceparent or "")
    if found is None or found[1] == "ff" or set(found[2]) == {"0"} or set(found[3]) == {"0"}:
        return None
    parent = trace.SpanContext(
        trace_id=int(found[2], 16),
        span_id=int(found[3], 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(int(found[4], 16) & 0x01),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def _ratio_sampler(ratio: float) -> Any:
    """A sampler keeping `ratio` of the traces, decided by a hash of the trace id (see the
    module docstring), so every process decides alike for one maintenance."""
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
    from opentelemetry.trace import get_current_span

    bound = round(ratio * 2**64)

    class RatioOfTraces(Sampler):
        def should_sample(
            self,
            parent_context: Context | None,
            trace_id: int,
            name: str,
            kind: Any = None,
            attributes: Any = None,
            links: Any = None,
            trace_state: Any = None,
        ) -> SamplingResult:
            digest = hashlib.sha256(trace_id.to_bytes(16, "big")).digest()
            keep = int.from_bytes(digest[:8], "big") < bound
            state = get_current_span(parent_context).get_span_context().trace_state
            if keep:
                return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, state)
            return SamplingResult(Decision.DROP, None, state)

        def get_description(self) -> str:
            return f"RatioOfTraces{{{ratio}}}"

    return RatioOfTraces()


_exporting: _Exporting | None = None


def configure(settings: TracingSettings | None, version: str) -> bool:
    """Start exporting with `settings` (None: nothing to do); whether spans are exported.

    Without the `otel` extra it logs a warning and the program runs untraced.
    """
    global _exporting
    if settings is None:
        return False
    try:
        exporting = _Exporting(settings, version)
    except ImportError as exc:
        log.warning(
            "tracing is configured but OpenTelemetry is not installed (%s); running without "
            "traces. Install the extra: %s",
            exc.name or exc,
            INSTALL_HINT,
        )
        return False
    shutdown()
    _exporting = exporting
    log.info(
        "exporting traces to %s as %s (sampling %g of maintenances)",
        settings.endpoint,
        settings.service_name,
        settings.sampling_ratio,
    )
    return True


def record(
    name: str,
    events: Iterable[Traced],
    start: float,
    attributes: Mapping[str, Value] | None = None,
) -> None:
    """One span `name` per event that has a `traceparent`, from `start` (Unix seconds) to
    now, child of the span it names. Does nothing (and does not iterate `events`) unless
    configured."""
    if _exporting is None:
        return
    _exporting.record(name, events, start, attributes or {})


def shutdown(timeout: float = 5.0) -> None:
    """Export what is buffered (waiting at most `timeout` seconds) and stop exporting."""
    global _exporting
    exporting, _exporting = _exporting, None
    if exporting is not None:
        exporting.provider.force_flush(int(timeout * 1000))
        exporting.provider.shutdown()
