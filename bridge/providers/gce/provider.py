"""Google Compute Engine as a `ProviderPlugin`: the metadata server at 169.254.169.254."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Final

from bridge.pipeline.watchers.http import check_once, probe_once
from bridge.providers.base import ProviderPlugin
from bridge.providers.gce.settings import GceSource

if TYPE_CHECKING:
    from bridge.config import Config, Source
    from bridge.contract import ProviderName
    from bridge.infra.findings import Finding
    from bridge.pipeline.watchers.base import Watcher


def _settings(source: Source) -> GceSource:
    return source.section("gce", GceSource)


class Gce(ProviderPlugin):
    name: ClassVar[ProviderName] = "gce"

    def watcher(
        self, config: Config, checkpoint: dict[str, Any] | None, **client_options: Any
    ) -> Watcher:
        from bridge.providers.gce import watcher

        client = watcher.new_client(_settings(config.source), **client_options)
        return watcher.GceWatcher(client, _settings(config.source), checkpoint)

    async def probe(self, source: Source) -> str | None:
        """Counts only with `Metadata-Flavor: Google` in the answer."""
        url = _settings(source).resolved_url()
        response, problem = await probe_once(
            "GCE metadata server", url, "", {"Metadata-Flavor": "Google"}, source.detect_timeout
        )
        if response is None:
            return problem
        if response.headers.get("metadata-flavor") != "Google":
            return f"GCE metadata server at {url}: no 'Metadata-Flavor: Google' in the answer"
        return None

    async def check_metadata(self, config: Config, timeout: float) -> Finding:
        from bridge.providers.gce import watcher

        client = watcher.new_client(_settings(config.source), timeout=timeout)
        return await check_once(
            client, watcher.MAINTENANCE_EVENT, None, " with Metadata-Flavor: Google", ""
        )


PROVIDER: Final = Gce()
