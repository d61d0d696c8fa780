"""What a component hands the operator surface: its figures and its health lines.

The flow goes one way. Each component of the running bridge (the watchers' supervision, the
dispatcher, the spool, the actions, the sinks' checks) renders its own figures into the
`/metrics` exposition (`Exporter`) and says itself what `/healthz` and `/readyz` should list
about it (`HealthSource`). The surface is handed these when the bridge is built and only
asks them; it never reaches through the bridge into a component's fields. Here, below every
package, so that any component can implement them without importing the surface.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from bridge.infra.prometheus import Exposition


@dataclass(frozen=True, slots=True)
class Check:
    """One line of a health report: what was checked, whether it is fine, and why not."""

    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


def all_ok(checks: Sequence[Check]) -> bool:
    return all(check.ok for check in checks)


class Exporter(Protocol):
    """A component's figures for `/metrics` (the spool's export reads SQLite, so it may be
    a coroutine function)."""

    def export(self, out: Exposition) -> Awaitable[None] | None: ...


class HealthSource(Protocol):
    """A component's lines for `/healthz` (is the process doing its job at all?) and
    `/readyz` (can it pass a notice on right now?)."""

    def liveness(self) -> list[Check]: ...

    def readiness(self) -> list[Check]: ...


@dataclass(frozen=True, slots=True)
class ReadinessLine:
    """A component that answers one readiness question with (ok, detail): one `/readyz`
    line named `name`, nothing for liveness (the coordination budget)."""

    name: str
    answer: Callable[[], tuple[bool, str]]

    def liveness(self) -> list[Check]:
        return []

    def readiness(self) -> list[Check]:
        return [Check(self.name, *self.answer())]
