"""Azure as a `ProviderPlugin`: Scheduled Events in the instance metadata service (IMDS)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Final

from bridge.pipeline.watchers.http import check_once, probe_once
from bridge.providers.azure.settings import AzureSource
from bridge.providers.base import ProviderPlugin

if TYPE_CHECKING:
    from bridge.config import Config, Source
    from bridge.contract import ProviderName
    from bridge.infra.findings import Finding
    from bridge.pipeline.watchers.base import Watcher


def _settings(source: Source) -> AzureSource:
    return source.section("azure", AzureSource)


class Azure(ProviderPlugin):
    name: ClassVar[ProviderName] = "azure"
    approves_events: ClassVar[bool] = True
    ids_ignore_case: ClassVar[bool] = True

    def watcher(
        self, config: Config, checkpoint: dict[str, Any] | None, **client_options: Any
    ) -> Watcher:
        from bridge.providers.azure import watcher

        client = watcher.new_client(_settings(config.source), **client_options)
        return watcher.AzureWatcher(client, _settings(config.source), checkpoint)

    async def probe(self, source: Source) -> str | None:
        """Counts only when `/metadata/instance` answers JSON with a `compute` section."""
        from bridge.providers.azure.watcher import INSTANCE_API_VERSION

        url = _settings(source).imds_url
        response, problem = await probe_once(
            "Azure IMDS",
            url,
            "instance",
            {"Metadata": "true"},
            source.detect_timeout,
            **{"api-version": INSTANCE_API_VERSION},
        )
        if response is None:
            return problem
        try:
            if response.status == 200 and "compute" in response.json():
                return None
        except (ValueError, TypeError):
            pass
        return f"Azure IMDS at {url}: HTTP {response.status}, not an instance document"

    async def check_metadata(self, config: Config, timeout: float) -> Finding:
        from bridge.providers.azure import watcher

        client = watcher.new_client(_settings(config.source), timeout=timeout)
        params = {"api-version": _settings(config.source).api_version}
        slow = "; the first Scheduled Events call after a while can take up to 2 minutes"
        return await check_once(client, "scheduledevents", params, "", slow)

    def approver(self, running: Callable[[], Watcher | None]) -> AzureApprover:
        return AzureApprover(running)


class AzureApprover:
    """Approves through the Azure watcher running now: the actions call `approve` and never
    see the watcher, the runner or which cloud it is."""

    def __init__(self, running: Callable[[], Watcher | None]) -> None:
        self._running = running

    async def approve(self, event_id: str) -> None:
        from bridge.providers.azure.watcher import AzureWatcher

        watcher = self._running()
        if not isinstance(watcher, AzureWatcher):
            raise RuntimeError("the Azure watcher is not running")
        await watcher.approve(event_id)


PROVIDER: Final = Azure()
