"""Amazon EC2 as a `ProviderPlugin`: the instance metadata service with IMDSv2 tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Final

from bridge.infra.findings import Finding
from bridge.providers.aws.settings import AwsSource
from bridge.providers.base import ProviderPlugin

if TYPE_CHECKING:
    from bridge.config import Config, Source
    from bridge.contract import ProviderName
    from bridge.pipeline.watchers.base import Watcher


def _settings(source: Source) -> AwsSource:
    return source.section("aws", AwsSource)


class Aws(ProviderPlugin):
    name: ClassVar[ProviderName] = "aws"

    def watcher(
        self, config: Config, checkpoint: dict[str, Any] | None, **client_options: Any
    ) -> Watcher:
        from bridge.providers.aws import watcher

        client = watcher.new_client(_settings(config.source), **client_options)
        return watcher.AwsWatcher(client, _settings(config.source), checkpoint)

    async def probe(self, source: Source) -> str | None:
        """A token PUT and the instance identity document (bridge/providers/aws/imds.py)."""
        from bridge.providers.aws import imds

        return await imds.probe(_settings(source).imds_url, source.detect_timeout)

    async def check_metadata(self, config: Config, timeout: float) -> Finding:
        """The IMDSv2 token PUT, then one read with it (bridge/providers/aws/imds.py)."""
        from bridge.providers.aws import imds

        verdict, detail, fix = await imds.check(_settings(config.source), timeout)
        return Finding("metadata", verdict, detail, fix)


PROVIDER: Final = Aws()
