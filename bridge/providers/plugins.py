"""The registered providers' plug-ins, typed: the providers' floor and those above read the
registry (`bridge.providerapi.registry`, on a floor below that cannot name `ProviderPlugin`)
through here.
"""

from __future__ import annotations

from bridge.contract import ProviderName
from bridge.providerapi import registry
from bridge.providerapi.registry import names as names
from bridge.providers.base import ProviderPlugin


def get(name: ProviderName) -> ProviderPlugin:
    """The provider's plug-in (imports its `provider.py` only)."""
    found = registry.load(name, "provider")
    if not isinstance(found, ProviderPlugin):
        raise registry.wrong_type(name, "provider", found, "ProviderPlugin")
    return found


def find(name: str) -> ProviderPlugin | None:
    """The plug-in of `name`, None when no registered provider has that name (a watcher
    handed over under another name, as tests do)."""
    known = registry.named(name)
    return None if known is None else get(known)
