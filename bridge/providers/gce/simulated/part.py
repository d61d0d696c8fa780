"""The GCE metadata server as a part of the simulator (`bridge.simulator.part`): its state,
routes, identity, scenario steps and vendor headers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Final

from bridge.simulator.clock import SimClock, rfc3339
from bridge.simulator.part import ActionParams, SimulatedProvider
from bridge.simulator.scenario import ScenarioError

from .state import GceIdentity, GceQuirks, GceState

if TYPE_CHECKING:
    from aiohttp import web

    from bridge.simulator.running import CountedFaults, RunningSimulator

HEADERS: Final = {
    "Metadata-Flavor": "Google",
    "Server": "Metadata Server for VM",
    "X-XSS-Protection": "0",
    "X-Frame-Options": "SAMEORIGIN",
}
_UPCOMING_TIME_FIELDS: Final = {
    "window_start_in": "window_start_time",
    "window_end_in": "window_end_time",
    "latest_window_start_in": "latest_window_start_time",
}


class SimulatedGce(SimulatedProvider):
    name: ClassVar[str] = "gce"
    title: ClassVar[str] = "GCE metadata"
    url_key: ClassVar[str] = "metadata_url"
    path_prefix: ClassVar[str] = ""  # the real server answers every path
    # AWS documents carry no audience and no expiry; only Azure's token names a resource
    attestation_faults: ClassVar[tuple[str, ...]] = (
        "expired",
        "wrong_audience",
        "bad_signature",
        "other_vm",
    )
    identity_type: ClassVar[type[Any]] = GceIdentity
    scenario_table: ClassVar[bool] = True  # [gce.initial]: the keys' values at the start
    unwatched_reason: ClassVar[str] = "instance/maintenance-event not queried since the last event"
    proxied: ClassVar[tuple[type[Any], ...]] = (GceState, GceQuirks)
    actions: ClassVar[dict[str, ActionParams]] = {
        "gce.set": (frozenset({"key", "value"}), frozenset()),
        "gce.upcoming": (
            frozenset(),
            frozenset(
                {
                    "type",
                    "maintenance_status",
                    "can_reschedule",
                    "window_start_in",
                    "window_end_in",
                    "latest_window_start_in",
                    "window_start_time",
                    "window_end_time",
                    "latest_window_start_time",
                    "maintenance_reasons",
                }
            ),
        ),
        "gce.upcoming.clear": (frozenset(), frozenset()),
    }

    def url(self, base_url: str) -> str:
        return f"{base_url}/computeMetadata/v1/"

    def attributes(self, sim: RunningSimulator) -> dict[str, str]:
        # `gce_host`: ``host:port``, the form ``GCE_METADATA_HOST`` takes.
        return super().attributes(sim) | {"gce_host": sim.address}

    def hints(self, sim: RunningSimulator) -> list[str]:
        return [f"    export GCE_METADATA_HOST={sim.address}"]

    def new_state(self, identity: Any, clock: SimClock, notify: Callable[[], None]) -> GceState:
        return GceState(identity, notify)

    def parse_table(self, table: dict[str, Any], where: str) -> dict[str, Any]:
        if set(table) - {"initial"}:
            raise ScenarioError(f"{where}: [gce] only takes an [gce.initial] table")
        return {"initial": {str(k): str(v) for k, v in table.get("initial", {}).items()}}

    def load(self, state: Any, table: dict[str, Any]) -> None:
        for key, value in table.get("initial", {}).items():
            state.values[key] = value

    def fault_response(self, status: int) -> web.Response:
        from aiohttp import web

        return web.Response(
            status=status, body=f"HTTP {status}\n".encode(), headers={"Content-Type": "text/html"}
        )

    def finish(self, response: web.StreamResponse, faults: CountedFaults) -> None:
        response.headers.update(HEADERS)
        if faults.take("missing_vendor_header"):
            del response.headers["Metadata-Flavor"]

    def execute(
        self, sim: RunningSimulator, action: str, params: dict[str, Any], at: float
    ) -> None:
        state = sim.state_of(self.name, GceState)
        if action == "gce.set":
            state.set(str(params["key"]), str(params["value"]))
        elif action == "gce.upcoming":
            for rel, absolute in _UPCOMING_TIME_FIELDS.items():
                if rel in params:
                    params[absolute] = rfc3339(sim.clock.wall_time_of(at + params.pop(rel)))
            state.set_upcoming_maintenance(params)
        elif action == "gce.upcoming.clear":
            state.set_upcoming_maintenance(None)

    def skips_warnings(self, state: Any) -> bool:
        return not state.maintenance_event_watched


SIMULATED: Final = SimulatedGce()
