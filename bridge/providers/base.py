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


class ProviderPlugin(abc.ABC):
    """One cloud's plug-in (`bridge.pipeline.model.Provider` is the enum of their names).
    Implementations import their watcher module lazily: detection loads every provider, and
    a VM pays only for the watcher it runs."""

    #: The `provider` of its events (the contract's enum) and the `[source.<name>]` key.
    name: ClassVar[ProviderName]
    #: Whether its Scheduled events can be approved early (Azure's StartRequests): the
    #: `[approval]` rules apply to them, and its watcher's checkpoint is handed back with the
    #: ids approved in any run under `approved` (an event that vanished after we approved it
    #: ran, rather than was cancelled). Such a provider has an `approver`.
    approves_events: ClassVar[bool] = False
    #: Whether its instance ids and resource names compare without regard to case (Azure's
    #: ARM ids: the managed identity token's `xms_mirid` and IMDS's `resourceId` differ in
    #: case); the fleet's identity checks ask it (`same_id`).
    ids_ignore_case: ClassVar[bool] = False

    def same_id(self, a: str, b: str) -> bool:
        """Whether `a` and `b` name the same instance or resource of this cloud."""
        return a.lower() == b.lower() if self.ids_ignore_case else a == b

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
