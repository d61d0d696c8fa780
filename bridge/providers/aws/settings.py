"""`[source.aws]`: where EC2's instance metadata service is and how to poll it."""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from bridge.providerapi.settings import BaseUrl, Positive, ProviderSettings

AWS_DEFAULT_URL: Final = "http://169.254.169.254/"


class AwsSource(ProviderSettings, frozen=True, kw_only=True):
    """EC2 instance metadata (IMDSv2); see bridge/providers/aws/watcher.py."""

    imds_url: BaseUrl = BaseUrl(AWS_DEFAULT_URL)
    #: Spot interruption and rebalance recommendation (two minutes of notice at most).
    poll_interval: Annotated[float, msgspec.Meta(ge=0.05)] = 1.0
    #: Scheduled events and the Auto Scaling lifecycle state (days or minutes of notice).
    maintenance_poll_interval: Positive = 60.0
    #: Seconds a session token lives (X-aws-ec2-metadata-token-ttl-seconds, 1 to 21600).
    token_ttl: Annotated[int, msgspec.Meta(ge=1, le=21600)] = 21600
    #: Read without a token when the token PUT is refused or times out (IMDSv1). Off: IMDSv1
    #: is what IMDSv2 exists to protect against.
    imds_v1_fallback: bool = False
    request_timeout: Positive = 5.0


#: The table's model, for bridge/config.py (through the registry).
SETTINGS: Final = AwsSource
