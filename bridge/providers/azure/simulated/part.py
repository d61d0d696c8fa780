"""Azure IMDS Scheduled Events as a part of the simulator (`bridge.simulator.part`): its
state, routes, identity, scenario steps and the rate limit IMDS documents."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, ClassVar, Final

from bridge.simulator.clock import SimClock
from bridge.simulator.part import ActionParams, SimulatedProvider, camel_case_aliases

from .state import AzureIdentity, AzureQuirks, AzureState

if TYPE_CHECKING:
    from aiohttp import web

    from bridge.simulator.running import RunningSimulator


class SimulatedAzure(SimulatedProvider):
    name: ClassVar[str] = "azure"
    title: ClassVar[str] = "Azure IMDS"
    url_key: ClassVar[str] = "imds_url"
    first_request: ClassVar[str] = "scheduledevents?api-version=2020-07-01"
    path_prefix: ClassVar[str] = "/metadata"
    rate_limited: ClassVar[bool] = True  # IMDS allows 5 requests/s
    # the token's `xms_mirid` can name another resource; the attested document's nonce
    # plays the audience
    attestation_faults: ClassVar[tuple[str, ...]] = (
        "expired",
        "wrong_audience",
        "wrong_resource",
        "bad_signature",
        "other_vm",
    )
    identity_type: ClassVar[type[Any]] = AzureIdentity
    # Overrides may use the JSON (camelCase) names users see in /metadata/instance.
    identity_aliases: ClassVar[dict[str, str]] = {
        **camel_case_aliases(
            "vm_id",
            "subscription_id",
            "resource_group_name",
            "vm_scale_set_name",
            "vm_size",
            "os_type",
        ),
        "resourceId": "explicit_resource_id",
        "resource_id": "explicit_resource_id",
    }
    proxied: ClassVar[tuple[type[Any], ...]] = (AzureState, AzureQuirks)
    actions: ClassVar[dict[str, ActionParams]] = {
        "azure.add": (
            frozenset(),
            frozenset(
                {
                    "event_id",
                    "event_type",
                    "resources",
                    "status",
                    "not_before_in",
                    "description",
                    "source",
                    "duration",
                    "started_for",
                    "auto_complete",
                }
            ),
        ),
        "azure.start": (frozenset({"event_id"}), frozenset()),
        "azure.remove": (frozenset({"event_id"}), frozenset()),
        "azure.approve": (frozenset({"event_id"}), frozenset()),
    }

    def url(self, base_url: str) -> str:
        return f"{base_url}/metadata/"

    def identity_json(self, identity: Any) -> dict[str, Any]:
        return asdict(identity) | {"resource_id": identity.resource_id}

    def new_state(self, identity: Any, clock: SimClock, notify: Callable[[], None]) -> AzureState:
        return AzureState(identity, clock, notify)

    def fault_response(self, status: int) -> web.Response:
        from .http import json_response

        return json_response(status, {"error": f"Simulated fault: HTTP {status}"})

    def throttled_response(self) -> web.Response:
        from .http import json_response

        return json_response(429, {"error": "Too many requests"})

    def execute(
        self, sim: RunningSimulator, action: str, params: dict[str, Any], at: float
    ) -> None:
        state = sim.state_of(self.name, AzureState)
        if action == "azure.add":
            state.add_event(**params, at=at)
        elif action == "azure.start":
            state.start_event(str(params["event_id"]), at=at)
        elif action == "azure.remove":
            state.remove_event(str(params["event_id"]))
        elif action == "azure.approve":
            state.approve([str(params["event_id"])], client="scenario", user_agent="")

    def next_due(self, state: Any) -> float | None:
        """Events that start or complete by themselves (`auto_complete`, `NotBefore`)."""
        due: float | None = state.next_due()
        return due

    def fire_due(self, state: Any, until: float) -> str | None:
        text: str | None = state.fire_due(until)
        return text


SIMULATED: Final = SimulatedAzure()
