"""The providers the bridge knows, by name: the one list to extend with a new cloud.

Like `sinks.registry`, a provider's module is imported only when it is asked for, so the
registry itself costs nothing at start-up. The order is detection's: the first provider
whose metadata service answers is the one watched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final, get_args

from bridge.contract import ProviderName

if TYPE_CHECKING:
    from bridge.providers.base import Provider

#: name -> module holding its `PROVIDER` (a `bridge.providers.base.Provider`).
PROVIDERS: Final[dict[ProviderName, str]] = {
    "gce": "bridge.providers.gce.provider",
    "azure": "bridge.providers.azure.provider",
    "aws": "bridge.providers.aws.provider",
}


def names() -> tuple[ProviderName, ...]:
    return tuple(PROVIDERS)


def get(name: ProviderName) -> Provider:
    found: Provider = importlib.import_module(PROVIDERS[name]).PROVIDER
    return found


def _check() -> None:
    """The registry and the contract's enum list the same providers (tests call this)."""
    assert set(PROVIDERS) == set(get_args(ProviderName)), (set(PROVIDERS), ProviderName)
