"""What a provider plugs into the simulator: its state, its routes, its identity and its
scenario steps, behind one small interface.

The server, the fault middleware, the identity, the scenario files and the control API know
the simulated clouds only through `SimulatedProvider` and `parts()`; everything a vendor does
its own way (paths, headers, status codes, error bodies, quirks) lives in the provider's folder
(`bridge/providers/<name>/simulated/`), found through `bridge.providerapi.registry`. A part's
module imports aiohttp only inside its methods: the scenario files are read by the CLI at
start-up.
"""

from __future__ import annotations

import abc
import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, ClassVar, Final

from bridge.contract import ProviderName
from bridge.providerapi import registry

if TYPE_CHECKING:
    from aiohttp import web

    from .clock import SimClock
    from .running import CountedFaults, RunningSimulator

#: A scenario action's (required, optional) parameters.
ActionParams = tuple[frozenset[str], frozenset[str]]

#: `--provider both` and a scenario's `provider = "both"`: the two clouds simulated before
#: AWS was (kept as they were; a new provider is served by `all`).
BOTH: Final = ("gce", "azure")


def camel_case_aliases(*fields: str) -> dict[str, str]:
    """`identity_aliases` for fields the vendor's JSON spells in camelCase (`vm_id`: `vmId`),
    so an identity override may use the name a user sees in the metadata."""
    return {_camel(field): field for field in fields}


def _camel(field: str) -> str:
    first, *others = field.split("_")
    return first + "".join(word.capitalize() for word in others)


class SimulatedProvider(abc.ABC):
    """One cloud's simulated metadata service."""

    #: The registry's name: the `[quirks.<name>]`, `[identity.<name>]` and `fault.set`
    #: `provider` key, the `<name>.*` scenario actions, the `sim.<name>` state.
    name: ClassVar[str]
    #: The request paths it answers; "" for the one that answers everything the others do
    #: not claim (its routes are added last).
    path_prefix: ClassVar[str]
    #: What the banner calls it ("GCE metadata"), and the bridge's `[source.<name>]` key for
    #: its URL; `first_request` follows the URL there (a path worth trying first).
    title: ClassVar[str]
    url_key: ClassVar[str]
    first_request: ClassVar[str] = ""
    #: The vendor's documented request rate limit is on unless a test clears it.
    rate_limited: ClassVar[bool] = False
    #: The identity it serves: a frozen dataclass with defaults for every field.
    identity_type: ClassVar[type[Any]]
    #: Other names an identity override may use for a field (the vendor's JSON names).
    identity_aliases: ClassVar[Mapping[str, str]] = {}
    #: Its scenario actions (`<name>.<verb>`), with their parameters.
    actions: ClassVar[Mapping[str, ActionParams]] = {}
    #: A scenario file may hold a top-level `[<name>]` table (see `parse_table`).
    scenario_table: ClassVar[bool] = False
    #: Why a step with `unwatched_delay` is postponed, when `skips_warnings` says it is.
    unwatched_reason: ClassVar[str] = ""
    #: The `attestation` faults its identity documents can show (`fault.set`): what the
    #: cloud's documents can get wrong (`bridge.simulator.attestation`).
    attestation_faults: ClassVar[tuple[str, ...]] = ()
    #: Types `SimulatorThread` proxies onto the loop thread (its state and quirks).
    proxied: ClassVar[tuple[type[Any], ...]] = ()

    def url(self, base_url: str) -> str:
        """The base URL a bridge is configured with (`sim.<name>_url`)."""
        return f"{base_url}/"

    def attributes(self, sim: RunningSimulator) -> dict[str, str]:
        """The `sim.<...>` attributes it adds (its URL, and what else its users need)."""
        return {f"{self.name}_url": self.url(sim.base_url)}

    def banner(self, sim: RunningSimulator) -> list[str]:
        """The lines `maintenance-bridge simulate` prints about it at start: what it serves
        (`title`, its URL and `first_request`), `hints`, and the bridge's key for the URL."""
        url = self.url(sim.base_url)
        return [
            f"  {self.title:<12}: {url}{self.first_request}",
            *self.hints(sim),
            f"    bridge config: source.{self.name}.{self.url_key} = {url}",
        ]

    def hints(self, sim: RunningSimulator) -> list[str]:
        """Banner lines between the URL and the bridge's key (GCE: the SDKs' variable)."""
        return []

    def identity_json(self, identity: Any) -> dict[str, Any]:
        """The identity as `GET /_sim/state` shows it."""
        return asdict(identity)

    @abc.abstractmethod
    def new_state(self, identity: Any, clock: SimClock, notify: Callable[[], None]) -> Any:
        """A clean VM's state, calling `notify` on every change (wakes long polls). The state
        has `quirks` (`update(dict)`, `as_dict()`) and `snapshot()`."""

    def parse_table(self, table: dict[str, Any], where: str) -> dict[str, Any]:
        """A scenario's `[<name>]` table, checked (raise `ScenarioError`)."""
        return table

    def load(self, state: Any, table: dict[str, Any]) -> None:
        """Apply a scenario's `[<name>]` table (from `parse_table`) to a clean state."""

    def routes(self, sim: RunningSimulator) -> list[web.RouteDef]:
        """Its vendor endpoints: `routes(sim)` of the `http` module beside the part, which
        is typed with the whole `Simulator` (the server hands itself over)."""
        routes: list[web.RouteDef] = self._http().routes(sim)
        return routes

    def control_routes(self, sim: RunningSimulator) -> list[web.RouteDef]:
        """Its part of the control API (`/_sim/<name>/...`): `control_routes(sim)` of the
        `http` module beside the part."""
        routes: list[web.RouteDef] = self._http().control_routes(sim)
        return routes

    def _http(self) -> Any:
        """The `http` module beside the part, imported when serving (it imports aiohttp)."""
        return importlib.import_module(type(self).__module__.rpartition(".")[0] + ".http")

    @abc.abstractmethod
    def fault_response(self, status: int) -> web.Response:
        """The answer to a `status_burst` fault, as the vendor renders that status."""

    def throttled_response(self) -> web.Response:
        """The answer over the rate limit."""
        return self.fault_response(429)

    def finish(self, response: web.StreamResponse, faults: CountedFaults) -> None:
        """Every answer's vendor headers (fault answers included)."""

    @abc.abstractmethod
    def execute(
        self, sim: RunningSimulator, action: str, params: dict[str, Any], at: float
    ) -> None:
        """Run one of its scenario actions at sim time `at`."""

    def skips_warnings(self, state: Any) -> bool:
        """A step with `unwatched_delay` is postponed (the vendor skips its warning)."""
        return False

    def next_due(self, state: Any) -> float | None:
        """Sim time of its next automatic transition, if any."""
        return None

    def fire_due(self, state: Any, until: float) -> str | None:
        """Run the transitions due by `until`; what happened, for the timeline."""
        return None


@functools.cache
def parts() -> tuple[SimulatedProvider, ...]:
    """Every registered provider's part, in the registry's order."""
    return tuple(_part(name) for name in registry.names())


def _part(name: ProviderName) -> SimulatedProvider:
    found = registry.load(name, "simulated.part")
    if not isinstance(found, SimulatedProvider):
        raise registry.wrong_type(name, "simulated.part", found, "SimulatedProvider")
    return found


def part(name: str) -> SimulatedProvider:
    for found in parts():
        if found.name == name:
            return found
    raise KeyError(name)


def names() -> tuple[str, ...]:
    return tuple(p.name for p in parts())


def choices() -> tuple[str, ...]:
    """What `--provider` and a scenario's `provider` take, in the order they always listed."""
    rest = tuple(name for name in registry.names() if name not in BOTH)
    return (*BOTH, "both", *rest, "all")


def spelled(names: tuple[str, ...], last: str = "or") -> str:
    """`'a', 'b' or 'c'`: the names as the error messages list them."""
    quoted = [f"'{name}'" for name in names]
    return ", ".join(quoted[:-1]) + f" {last} " + quoted[-1] if len(quoted) > 1 else quoted[0]
