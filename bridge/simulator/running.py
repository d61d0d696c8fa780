"""The running simulator and a provider's fault set as a provider's part sees them.

`SimulatedProvider`'s methods take the simulator and a fault set, while the simulator and the
faults are built from the parts: naming `Simulator` and `FaultSet` in `part.py` would make
the part and the server import each other. These protocols hold only what a part uses;
`Simulator` and `FaultSet` satisfy them structurally, and mypy checks each member's type
wherever the server and the vendor middleware hand them to a part. (A member `Simulator`
lacks passes mypy, as its `__getattr__` answers any name - `sim.gce`, `sim.gce_url` - but
fails the simulator tests.) Grow them when a part needs more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from .clock import SimClock

_State = TypeVar("_State")


class RunningSimulator(Protocol):
    """What a part reads of the simulator serving it (`Simulator`)."""

    @property
    def address(self) -> str:
        """``host:port``."""

    @property
    def base_url(self) -> str:
        """``http://host:port``."""

    @property
    def clock(self) -> SimClock:
        """The simulated time its steps and transitions run on."""

    def state_of(self, name: str, kind: type[_State]) -> _State:
        """Provider `name`'s state, typed (a `TypeError` if it is not a `kind`)."""


class CountedFaults(Protocol):
    """What a part's `finish` consumes of its provider's faults (`FaultSet`)."""

    def take(self, name: str) -> bool:
        """Consume one unit of a counted fault; True if this request is affected."""
