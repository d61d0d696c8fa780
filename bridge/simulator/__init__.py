"""A faithful local simulator of the GCE metadata server, Azure IMDS Scheduled Events and
AWS EC2 instance metadata (IMDSv2).

It serves the vendors' URLs, headers, status codes and long-poll behavior, plays scripted
scenarios on a compressible clock, injects faults, and can be driven live from Python or over
HTTP (``/_sim/``).  See docs/simulator.md.

Each cloud's part (its state, routes, identity, scenario steps and vendor headers) lives in
its provider's folder, ``bridge/providers/<name>/simulated/``, behind
:class:`~bridge.simulator.part.SimulatedProvider`; this package is what they share.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .clock import SimClock
    from .faults import Faults
    from .identity import Identity
    from .part import SimulatedProvider
    from .requestlog import RequestRecord
    from .scenario import (
        Scenario,
        ScenarioError,
        ScenarioInfo,
        Step,
        list_scenarios,
        load_scenario,
    )
    from .server import Simulator
    from .threaded import SimulatorThread

# Names are imported on first use (PEP 562): `maintenance-bridge run` builds its argument
# parser with the `simulate` options but must not pay for aiohttp at start-up.
_HOMES = {
    "SimClock": "clock",
    "Faults": "faults",
    "Identity": "identity",
    "SimulatedProvider": "part",
    "RequestRecord": "requestlog",
    "Scenario": "scenario",
    "ScenarioError": "scenario",
    "ScenarioInfo": "scenario",
    "Step": "scenario",
    "list_scenarios": "scenario",
    "load_scenario": "scenario",
    "Simulator": "server",
    "SimulatorThread": "threaded",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Faults",
    "Identity",
    "RequestRecord",
    "Scenario",
    "ScenarioError",
    "ScenarioInfo",
    "SimClock",
    "SimulatedProvider",
    "Simulator",
    "SimulatorThread",
    "Step",
    "list_scenarios",
    "load_scenario",
]
