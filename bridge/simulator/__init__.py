"""A faithful local simulator of the GCE metadata server and Azure IMDS Scheduled Events.

It serves the vendors' URLs, headers, status codes and long-poll behavior, plays scripted
scenarios on a compressible clock, injects faults, and can be driven live from Python or over
HTTP (``/_sim/``).  See docs/simulator.md.
"""

from .azure import AzureState
from .clock import SimClock
from .faults import Faults
from .gce import GceState
from .identity import AzureIdentity, GceIdentity, Identity
from .requestlog import RequestRecord
from .scenario import Scenario, ScenarioError, ScenarioInfo, Step, list_scenarios, load_scenario
from .server import Simulator
from .threaded import SimulatorThread

__all__ = [
    "AzureIdentity",
    "AzureState",
    "Faults",
    "GceIdentity",
    "GceState",
    "Identity",
    "RequestRecord",
    "Scenario",
    "ScenarioError",
    "ScenarioInfo",
    "SimClock",
    "Simulator",
    "SimulatorThread",
    "Step",
    "list_scenarios",
    "load_scenario",
]
