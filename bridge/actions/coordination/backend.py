"""What the bridge needs of a coordination engine: a counting semaphore on leases.

A second engine (Consul sessions, a Kubernetes Lease per slot) implements `Backend`; the
policy (waiting, deadlines, `on_unavailable`, metrics, audit) is
`bridge.actions.coordination.budget` and is the same for all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Unavailable(Exception):
    """The engine cannot be reached (no endpoint answered, or it answered 5xx)."""


class EngineError(Exception):
    """The engine answered, and refused (bad credentials, a request it does not accept)."""


@dataclass(frozen=True, slots=True)
class Holder:
    """One taken slot of a group: who holds it, since which engine revision."""

    slot: str
    member: str
    since_revision: int


class Backend(Protocol):
    """A group's semaphore. Slots are tied to the process's lease: if the process dies or
    stays away longer than the lease's time to live, its slots free themselves."""

    #: Called with (group, why) for a held slot whose lease was not renewed by the local
    #: deadline (`lease_timing.Timing`): from then on another member may take it.
    on_unrenewed: Callable[[str, str], None]

    async def acquire(self, group: str, member: str, budget: int) -> Holder | None:
        """Take a slot of `group` for `member`, or None when `budget` slots are taken by
        others. A slot `member` already holds (from an earlier life of this process, its
        lease not expired yet) is taken over, not doubled."""
        ...

    async def release(self, group: str, member: str) -> None:
        """Give `member`'s slot of `group` back (nothing if it holds none)."""
        ...

    async def holders(self, group: str) -> list[Holder]:
        """The slots of `group` taken now."""
        ...

    async def describe(self) -> str:
        """One line on the engine (version, which endpoint answered), for `doctor`."""
        ...

    @property
    def lost(self) -> int:
        """How many times a held slot was found gone (the lease expired meanwhile)."""
        ...

    async def aclose(self) -> None:
        """Release nothing, just stop renewing and close connections (slots expire)."""
        ...
