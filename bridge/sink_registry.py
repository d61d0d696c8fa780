"""Finds the module of a sink type: built-ins by name, third-party ones by entry point.

A sink module exposes `Config` (a `SinkConfig` subclass) and `create(config, name)`. Only
the modules of configured types are imported, and those import their SDKs lazily.

The built-in sinks (`sinks/`) are named here as module strings and loaded with importlib,
here only: the sinks import the bridge (`bridge.sinkapi`, `bridge.transports`), and no
module of `bridge/` imports `sinks`, so the two never form an import cycle.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Final

from bridge.sinkapi import Sink, SinkConfig

ENTRY_POINT_GROUP: Final = "maintenance_bridge.sinks"
BUILTIN: Final = {
    "stdout": "sinks.stdout",
    "file": "sinks.file",
    "webhook": "sinks.webhook",
    "memory": "sinks.memory",
    "pubsub": "sinks.pubsub",
    "eventhubs": "sinks.eventhubs",
    "kafka": "sinks.kafka",
}
#: Built-ins for tests and embedding (`type = "memory"` still works), never offered to a user.
INTERNAL: Final = frozenset({"memory"})


class UnknownSinkTypeError(LookupError):
    pass


def known_types() -> list[str]:
    """The sink types a configuration may name: the built-ins (less the internal ones) and
    those of installed plugins."""
    from importlib.metadata import entry_points

    plugins = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted((set(BUILTIN) - INTERNAL) | plugins)


def module_for(sink_type: str) -> ModuleType:
    if sink_type in BUILTIN:
        try:
            return importlib.import_module(BUILTIN[sink_type])
        except ModuleNotFoundError as exc:
            if exc.name == BUILTIN[sink_type]:
                raise UnknownSinkTypeError(
                    f"sink type {sink_type!r} is not available in this build"
                ) from exc
            raise
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP, name=sink_type):
        module: ModuleType = ep.load()
        return module
    import difflib  # only for a mistake: 0.2 MiB a running bridge does not need

    known = known_types()
    close = difflib.get_close_matches(sink_type, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UnknownSinkTypeError(f"unknown sink type {sink_type!r}{hint} (known: {', '.join(known)})")


def config_model(sink_type: str) -> type[SinkConfig]:
    model: type[SinkConfig] = module_for(sink_type).Config
    return model


def create(config: SinkConfig, name: str) -> Sink:
    sink: Sink = module_for(config.type).create(config, name)
    return sink
