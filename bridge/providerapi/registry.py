"""The providers the bridge knows, by name: the one list to extend with a new cloud.

Each name maps to the provider's package (`bridge/providers/<name>/`), which holds by
convention `provider.py` (its `PROVIDER`, a `bridge.providers.base.Provider`),
`settings.py` (its `SETTINGS`, the `[source.<name>]` table's model) and `simulated/part.py`
(its `SIMULATED`, the simulated metadata service). Like the sink registry, a module is
imported only when it is asked for, and only here (`importlib`): `bridge/config.py` asks for
the settings only (tiny modules), and a VM pays only for the watcher it runs. The order is
detection's: the first provider whose metadata service answers is the one watched.

This floor sits below its readers (the configuration, the simulator, the providers), so it
names none of their types: `load` returns what a part exports and its reader checks the
type (`bridge.providers.plugins.get`, `bridge.simulator.part.parts`).
"""

from __future__ import annotations

import importlib
from typing import Final, Literal, get_args

from bridge.contract import ProviderName
from bridge.providerapi.settings import ProviderSettings

#: name -> the provider's package.
PROVIDERS: Final[dict[ProviderName, str]] = {
    "gce": "bridge.providers.gce",
    "azure": "bridge.providers.azure",
    "aws": "bridge.providers.aws",
}

#: A provider's parts: the module under its package -> the name that module exports.
Part = Literal["provider", "settings", "simulated.part", "identity"]
EXPORTS: Final[dict[Part, str]] = {
    "provider": "PROVIDER",
    "settings": "SETTINGS",
    "simulated.part": "SIMULATED",
    # Optional: `attestation(config, audience)`, the VM's signed identity document.
    "identity": "attestation",
}


def names() -> tuple[ProviderName, ...]:
    return tuple(PROVIDERS)


def named(name: str) -> ProviderName | None:
    """`name` as a registered provider's name, or None."""
    for known in PROVIDERS:
        if known == name:
            return known
    return None


def load(name: ProviderName, part: Part) -> object:
    """What the provider's `part` exports (imports that one module; `ModuleNotFoundError`
    for an optional part it lacks). Its reader, on a floor that can name the type, checks it
    and raises `wrong_type` if it is not one."""
    module = importlib.import_module(f"{PROVIDERS[name]}.{part}")
    found: object = getattr(module, EXPORTS[part])
    return found


def wrong_type(name: ProviderName, part: Part, found: object, expected: str) -> TypeError:
    """The error for a part that is not what its reader expects, saying where it came from."""
    where = f"{PROVIDERS[name]}.{part}.{EXPORTS[part]}"
    return TypeError(f"{where} is a {type(found).__name__}, not a {expected}")


def settings_model(name: ProviderName) -> type[ProviderSettings]:
    """The model of `[source.<name>]` (imports the provider's `settings.py` only)."""
    found = load(name, "settings")
    if not (isinstance(found, type) and issubclass(found, ProviderSettings)):
        raise wrong_type(name, "settings", found, "ProviderSettings subclass")
    return found


def _check() -> None:
    """The registry and the contract's enum list the same providers (tests call this)."""
    assert set(PROVIDERS) == set(get_args(ProviderName)), (set(PROVIDERS), ProviderName)
