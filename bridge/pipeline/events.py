"""Normalization: a `Notice` becomes a CloudEvent of the public contract, schema version 1.

`to_cloudevent` is pure: the same notice always gives the same event, byte for byte, on any
machine. The event id is a UUIDv5 of the source, the notice id, the status and the revision,
so a transition announced again after a restart or by a second replica keeps its id and
consumers can de-duplicate on `source` + `id`, while two different transitions never share
one. Everything downstream (spool, sinks) handles the structured-JSON bytes this module
writes, and reads them back with `parse`.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from functools import cache
from typing import Any, Final

from cloudevents.core.v1.event import CloudEvent

# The contract's constants, re-exported: the one definition lives in bridge/contract.py.
from bridge.contract import CONTENT_TYPE as CONTENT_TYPE
from bridge.contract import MAINTENANCE_TYPES
from bridge.contract import SCHEMA_URI as SCHEMA_URI
from bridge.contract import SCHEMA_VERSION as SCHEMA_VERSION
from bridge.contract import TYPE_PREFIX as TYPE_PREFIX

# The wire format, re-exported: its one definition is bridge/infra/encoding.py.
from bridge.infra.encoding import as_dict as as_dict
from bridge.infra.encoding import parse as parse
from bridge.infra.encoding import serialize as serialize
from bridge.pipeline.model import Notice, Window

SCHEMA_FILE: Final = f"maintenance-event.v{SCHEMA_VERSION}.json"
EVENT_TYPES: Final = MAINTENANCE_TYPES

# Fixed forever: changing it would change every event id ever emitted.
_ID_NAMESPACE: Final = uuid.UUID("6f1c3a52-90b1-4c57-9d1e-6a0c1b7e2d45")
# Fixed forever too: the trace ids of events already delivered must not change.
_TRACE_NAMESPACE: Final = uuid.UUID("0b5a7f0e-3c1d-5e8a-9f42-7d6c2e1b4a93")


def event_id(notice: Notice) -> str:
    """The deterministic id of the transition `notice` records."""
    key = "\n".join(
        (notice.instance.source, notice.notice_id, notice.status.value, notice.revision)
    )
    return str(uuid.uuid5(_ID_NAMESPACE, key))


def traceparent(notice: Notice) -> str:
    """The CloudEvents distributed-tracing extension (W3C Trace Context `traceparent`) of the
    event announcing `notice`: one trace per maintenance (the trace id is a UUIDv5 of the
    source and the notice id), one span per transition (the parent id is derived from the
    event id). Deterministic like the id, so an event announced again carries the same one,
    and every event of one maintenance, from the metadata service to the fleet's audit log,
    shares one trace id."""
    trace = uuid.uuid5(_TRACE_NAMESPACE, f"{notice.instance.source}\n{notice.notice_id}").hex
    span = uuid.uuid5(_TRACE_NAMESPACE, event_id(notice)).hex[:16]
    return f"00-{trace}-{span}-01"  # version 00, sampled


def rfc3339(value: datetime | None) -> str | None:
    """UTC RFC 3339 with a `Z`, second precision unless the source had fractions."""
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat()
    return text.removesuffix("+00:00") + "Z"


def _window(window: Window | None) -> dict[str, str | None] | None:
    if window is None:
        return None
    return {
        "start": rfc3339(window.start),
        "end": rfc3339(window.end),
        "latest_start": rfc3339(window.latest_start),
    }


def notice_data(notice: Notice) -> dict[str, Any]:
    """The `data` object of schema version 1.

    `outcome_inferred` came later (additively): written only when true, after `raw`, so
    every other event keeps its bytes and a typed event writes it back in the same place.
    """
    data: dict[str, Any] = {
        "provider": notice.provider.value,
        "instance": notice.instance.as_data(),
        "kind": notice.kind.value,
        "status": notice.status.value,
        "notice_id": notice.notice_id,
        "not_before": rfc3339(notice.not_before),
        "not_before_estimated": notice.not_before_estimated,
        "window": _window(notice.window),
        "duration_seconds": notice.duration_seconds,
        "affected": list(notice.affected),
        "origin": notice.origin.value if notice.origin else None,
        "description": notice.description,
        "can_reschedule": notice.can_reschedule,
        "raw": notice.raw,
    }
    if notice.outcome_inferred:
        data["outcome_inferred"] = True
    return data


def to_cloudevent(notice: Notice) -> CloudEvent:
    """The CloudEvent that announces `notice` (pure; see the module docstring)."""
    attributes: dict[str, Any] = {
        "specversion": "1.0",
        "id": event_id(notice),
        "source": notice.instance.source,
        "type": TYPE_PREFIX + notice.status.value,
        "subject": notice.instance.name,
        "time": notice.observed_at.astimezone(UTC),
        "datacontenttype": CONTENT_TYPE,
        "dataschema": SCHEMA_URI,
        "traceparent": traceparent(notice),
    }
    return CloudEvent(attributes, notice_data(notice))


@cache
def schema_text() -> str:
    """The JSON Schema of version 1, as shipped in the package."""
    # Imported here: importlib.resources pulls in tempfile, shutil and the compression
    # modules, 0.8 MiB of a running bridge's footprint for a file it rarely reads.
    from importlib import resources

    return (resources.files("bridge") / "schemas" / SCHEMA_FILE).read_text(encoding="utf-8")


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(schema_text())
    return loaded
