"""The sink plug-in surface: everything a sink (built-in or third-party) needs, from one place.

A sink module imports from here only: the `Sink` interface and the outcomes it reports
(`Ok`, `Retry`, `Reject`, `Result`, `Health`; `Encoded`, an event as the spool holds it),
the configuration base `SinkConfig` with the field types and errors its checks use
(`Secret`, `HttpUrl`, `FieldError`, `ConfigError`) and `validate` (how the bridge builds a
`Config`; a sink's tests call it too), and the wire format of the events it sends
(`serialize`, `parse`, `as_dict`; `dumps` for a binary-mode body and `json_format` for the
SDK's bindings, so that every sink writes the contract's one JSON form). The bridge in turn
reaches sinks through here and `sinks.registry`, so neither side depends on the other's
internals and there is no import cycle (tests/test_layers.py checks both).
"""

from __future__ import annotations

from bridge.infra.encoding import as_dict, dumps, json_format, parse, serialize
from bridge.infra.secrets import Secret
from bridge.infra.validation import ConfigError, FieldError, HttpUrl, validate
from sinks.base import (
    Encoded,
    Health,
    Ok,
    Reject,
    Result,
    Retry,
    Sink,
    SinkClosedError,
    SinkConfig,
)

__all__ = [
    "ConfigError",
    "Encoded",
    "FieldError",
    "Health",
    "HttpUrl",
    "Ok",
    "Reject",
    "Result",
    "Retry",
    "Secret",
    "Sink",
    "SinkClosedError",
    "SinkConfig",
    "as_dict",
    "dumps",
    "json_format",
    "parse",
    "serialize",
    "validate",
]
