"""`[source.azure]`: where Azure's instance metadata service is and how to poll it."""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from bridge.providerapi.settings import BaseUrl, Positive, ProviderSettings

AZURE_DEFAULT_URL: Final = "http://169.254.169.254/metadata/"


class AzureSource(ProviderSettings, frozen=True, kw_only=True):
    imds_url: BaseUrl = BaseUrl(AZURE_DEFAULT_URL)
    #: IMDS allows 5 requests/s.
    poll_interval: Annotated[float, msgspec.Meta(ge=0.2)] = 1.0
    api_version: str = "2020-07-01"
    request_timeout: Positive = 10.0
    first_call_timeout: Positive = 150.0


#: The table's model, for bridge/config.py (through the registry).
SETTINGS: Final = AzureSource
