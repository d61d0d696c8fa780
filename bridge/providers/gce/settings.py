"""`[source.gce]`: where the GCE metadata server is and what to watch on it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Final

import msgspec

from bridge.providerapi.settings import BaseUrl, Positive, ProviderSettings

GCE_DEFAULT_URL: Final = "http://metadata.google.internal/computeMetadata/v1/"


class GceSource(ProviderSettings, frozen=True, kw_only=True):
    #: Base URL; default from GCE_METADATA_HOST, else metadata.google.internal.
    metadata_url: BaseUrl | None = None
    long_poll_timeout: Annotated[int, msgspec.Meta(ge=1, le=3600)] = 60
    watch_preempted: bool = True
    watch_upcoming: bool = True
    upcoming_poll_interval: Positive = 30.0

    def resolved_url(self, environ: Mapping[str, str] = os.environ) -> str:
        """Explicit config first, then GCE_METADATA_HOST (as Google's libraries do)."""
        if self.metadata_url:
            return self.metadata_url
        host = environ.get("GCE_METADATA_HOST")
        if host:
            return f"http://{host}/computeMetadata/v1/"
        return GCE_DEFAULT_URL


#: The table's model, for bridge/config.py (through the registry).
SETTINGS: Final = GceSource
