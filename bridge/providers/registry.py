"""The providers the bridge knows, by name: the one list to extend with a new cloud.

Each name maps to the provider's package (`bridge/providers/<name>/`), which holds by
convention `provider.py` (its `PROVIDER`, a `bridge.providers.base.ProviderPlugin`),
`settings.py` (its `SETTINGS`, the `[source.<name>]` table's model) and `simulated/part.py`
(its `SIMULATED`, the simulated metadata service). Like `bridge.sinkapi.registry`, a
module is imported only when it is asked for: `bridge/config.py` asks for the settings only
(tiny modules), and a VM pays only for the watcher it runs. The order is detection's: the
first provider whose metadata service answers is the one watched.

A configuration-layer module (tests/test_layers.py): the configuration reads it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final, get_args

from bridge.contract import ProviderName

if TYPE_CHECKING:
    from bridge.providers.base import ProviderPlugin
    from bridge.providers.settings import ProviderSettings
    from bridge.simulator.part import SimulatedProvider

#: name -> the provider's package.
PROVIDERS: Final[dict[ProviderName, str]] = {
    "gce": "bridge.providers.gce",
    "azure": "bridge.providers.azure",
    "aws": "bridge.providers.aws",
}


def names() -> tuple[ProviderName, ...]:
    return tuple(PROVIDERS)


def get(name: ProviderName) -> ProviderPlugin:
    found: ProviderPlugin = importlib.import_module(f"{PROVIDERS[name]}.provider").PROVIDER
    return found


def find(name: str) -> ProviderPlugin | None:
    """The plug-in of `name`, None when no registered provider has that name (a watcher the
    runner was handed under another name, as tests do)."""
    return get(name) if name in PROVIDERS else None


def settings_model(name: ProviderName) -> type[ProviderSettings]:
    """The model of `[source.<name>]` (imports the provider's `settings.py` only)."""
    found: type[ProviderSettings] = importlib.import_module(f"{PROVIDERS[name]}.settings").SETTINGS
    return found


def simulated(name: ProviderName) -> SimulatedProvider:
    """Its part of the simulator (imports the provider's `simulated/part.py`)."""
    module = importlib.import_module(f"{PROVIDERS[name]}.simulated.part")
    found: SimulatedProvider = module.SIMULATED
    return found


def _check() -> None:
    """The registry and the contract's enum list the same providers (tests call this)."""
    assert set(PROVIDERS) == set(get_args(ProviderName)), (set(PROVIDERS), ProviderName)
