"""An event is accepted only about the instance its credential names (403 otherwise).

Compared: the CloudEvents `source` (the instance's resource: GCE's full resource name,
Azure's resource id, AWS's ARN), and, in the data, the provider, the instance id and the
project, subscription or account, wherever the attestation names them. Azure's resource ids
are compared case-insensitively (ARM ids are; the token's `xms_mirid` and IMDS's
`resourceId` differ in case).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

from bridge import contract
from bridge.providers import plugins as registry

from .model import Attested

#: Whether two ids name the same instance or resource.
Same = Callable[[str, str], bool]


@functools.cache
def comparer(provider: str) -> Same:
    """How `provider`'s cloud compares ids (its plug-in says: Azure's without regard to
    case). Looked up once per request, not per id: a post's events share one credential;
    and kept, as the registry of providers is fixed (the look-up imports the plug-in's
    module, 2 us, a third of what screening a one-event post cost)."""
    plugin = registry.find(provider)
    return plugin.same_id if plugin is not None else operator.eq


def same_id(provider: str, a: str, b: str) -> bool:
    """Whether `a` and `b` name the same instance or resource of `provider`'s cloud."""
    return comparer(provider)(a, b)


def mismatch(attested: Attested, event: contract.Event, same: Same | None = None) -> str | None:
    """Why `event` is not about the attested instance, or None when it is. `same`:
    `comparer(attested.provider)`, when the caller checks several events."""
    if same is None:
        same = comparer(attested.provider)
    if attested.source is not None and not same(event.source, attested.source):
        return f"event source {event.source!r} is not the enrolled instance {attested.source!r}"
    provider = event.provider
    if provider is not None and provider != attested.provider:
        return f"event provider {provider!r} is not the enrolled {attested.provider!r}"
    instance = event.instance
    for field in ("id", "project", "subscription", "account"):
        expected = getattr(attested, field)
        given = getattr(instance, field)
        if expected is not None and given is not None and not same(str(given), str(expected)):
            return f"event instance {field} {given!r} is not the enrolled {expected!r}"
    return None
