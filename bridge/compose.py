"""The composition root: the one function that builds a bridge ready to run.

`run`, `demo`, the fleet demo and the tests' `running_bridge` all build the same thing (the
spool with one queue per sink, a watcher factory per provider, and the `Bridge` that owns the
dispatcher and the actions), so they build it here and cannot drift apart: a component added
to the bridge is added once. What differs between them is passed in: the providers (detected
by `run`, all of them in `demo`), the sinks (the configured ones unless given), and options
for the metadata clients (tests shorten their backoff). The listener is not built here: `run`
serves `/healthz` while it is still detecting the cloud, before there is a bridge to attach.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bridge.config import Config
from bridge.contract import ProviderName
from bridge.pipeline.spool import Spool
from bridge.runner import Bridge, WatcherFactory, build_sinks, watcher_factory
from bridge.sinkapi import Sink


def compose(
    config: Config,
    providers: Sequence[ProviderName],
    sinks: Sequence[Sink] | None = None,
    **client_options: Any,
) -> Bridge:
    """A bridge watching `providers` and delivering to `sinks` (default: the configured ones),
    its spool in `config.state.dir`; call `run(stop)` on it."""
    chosen = list(sinks) if sinks is not None else build_sinks(config)
    spool = Spool(config.state.dir, [sink.name for sink in chosen], config.delivery.max_pending)
    factories: dict[str, WatcherFactory] = {
        name: watcher_factory(config, name, **client_options) for name in providers
    }
    return Bridge(config, factories, chosen, spool)
