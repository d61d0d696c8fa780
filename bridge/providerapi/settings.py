"""What every provider's `[source.<name>]` table is built from.

On the floor below the configuration (docs/architecture.md): `bridge/config.py` assembles
`[source]` from the providers' own `settings.py` files (loaded through the registry), which
subclass this. So it, and they, import only msgspec and `bridge.infra` (no HTTP client:
`bridge.config` is on the run path).
"""

from __future__ import annotations

from typing import Annotated, Self

import msgspec

from bridge.infra.validation import HttpUrl

Positive = Annotated[float, msgspec.Meta(gt=0)]


class ProviderSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """A provider's `[source.<name>]` table: unknown keys are errors and the values never
    change; every key has a default, so the table may be left out.

    Subclasses repeat `frozen=True, kw_only=True`: msgspec inherits them, type checkers don't.
    """


class BaseUrl(HttpUrl):
    """A metadata service's base URL; relative paths are joined to it, so it ends in `/`."""

    __slots__ = ()

    @classmethod
    def from_config(cls, value: object) -> Self:
        url = super().from_config(value)
        return url if url.endswith("/") else cls(url + "/")
