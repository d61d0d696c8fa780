"""What a cloud provider plugs into the bridge: its watcher, its detection probe and its
`doctor` metadata check, behind one small interface.

The runner, `provider = "auto"` detection, `doctor` and the actions (through an
`Approver`, for a cloud that can approve) know providers only through this
interface and `bridge.providers.plugins`; everything specific to a cloud (its metadata
paths, headers and quirks, its `[source.<name>]` settings, its simulated metadata service)
stays in the provider's own folder (docs/architecture.md, "Add a provider").
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from bridge.config import Config, Source
    from bridge.contract import ProviderName
    from bridge.infra.findings import Finding
    from bridge.pipeline.approver import Approver
    from bridge.pipeline.watchers.base import Watcher


class Provider(abc.ABC):
    """One cloud. Implementations import their watcher module lazily: detection loads every
    provider, and a VM pays only for the watcher it runs."""

    #: The `provider` of its events (the contract's enum) and the `[source.<name>]` key.
    name: ClassVar[ProviderName]

    @abc.abstractmethod
    def watcher(
        self, config: Config, checkpoint: dict[str, Any] | None, **client_options: Any
    ) -> Watcher:
        """A watcher resuming from `checkpoint`; `client_options` go to its metadata client."""

    @abc.abstractmethod
    async def probe(self, source: Source) -> str | None:
        """`provider = "auto"`: None when this cloud's metadata service answers, else why not
        (one line naming the URL, shown to the user when no provider answers)."""

    @abc.abstractmethod
    async def check_metadata(self, config: Config, timeout: float) -> Finding:
        """`doctor`'s "metadata" line: one plain request with the vendor's header rules."""

    def approver(self, running: Callable[[], Watcher | None]) -> Approver | None:
        """What approves this cloud's maintenance early (Azure's StartRequests), through the
        watcher `running()` returns (it is rebuilt after a crash); None when it cannot."""
        return None
