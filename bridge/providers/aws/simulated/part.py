"""EC2 instance metadata (IMDSv2) as a part of the simulator (`bridge.simulator.part`): its
state, routes, identity, scenario steps and vendor headers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Final

from bridge.simulator.clock import SimClock
from bridge.simulator.part import ActionParams, SimulatedProvider, camel_case_aliases

from .state import AwsIdentity, AwsQuirks, AwsState

if TYPE_CHECKING:
    from aiohttp import web

    from bridge.simulator.running import CountedFaults, RunningSimulator


class SimulatedAws(SimulatedProvider):
    name: ClassVar[str] = "aws"
    path_prefix: ClassVar[str] = "/latest/"
    title: ClassVar[str] = "AWS IMDS"
    url_key: ClassVar[str] = "imds_url"
    first_request: ClassVar[str] = "latest/meta-data/spot/instance-action (IMDSv2)"
    # the document carries no audience and no expiry; it can be replayed
    attestation_faults: ClassVar[tuple[str, ...]] = ("bad_signature", "other_vm", "replayed")
    identity_type: ClassVar[type[Any]] = AwsIdentity
    # Overrides may use the identity document's (camelCase) names.
    identity_aliases: ClassVar[dict[str, str]] = camel_case_aliases(
        "instance_id", "account_id", "availability_zone", "instance_type", "image_id", "private_ip"
    )
    proxied: ClassVar[tuple[type[Any], ...]] = (AwsState, AwsQuirks)
    actions: ClassVar[dict[str, ActionParams]] = {
        "aws.spot": (frozenset(), frozenset({"spot_action", "time_in"})),
        "aws.spot.clear": (frozenset(), frozenset()),
        "aws.rebalance": (frozenset(), frozenset()),
        "aws.rebalance.clear": (frozenset(), frozenset()),
        "aws.event": (
            frozenset(),
            frozenset(
                {
                    "event_id",
                    "code",
                    "description",
                    "state",
                    "not_before_in",
                    "not_after_in",
                    "deadline_in",
                }
            ),
        ),
        "aws.event.state": (frozenset({"event_id", "state"}), frozenset()),
        "aws.event.complete": (frozenset({"event_id"}), frozenset()),
        "aws.event.cancel": (frozenset({"event_id"}), frozenset()),
        "aws.event.remove": (frozenset({"event_id"}), frozenset()),
        "aws.lifecycle": (frozenset({"state"}), frozenset()),
        "aws.tokens.expire": (frozenset(), frozenset()),
    }

    def url(self, base_url: str) -> str:
        """The IMDS base URL (`source.aws.imds_url`): paths start with ``latest/``."""
        return f"{base_url}/"

    def new_state(self, identity: Any, clock: SimClock, notify: Callable[[], None]) -> AwsState:
        return AwsState(identity, clock, notify)

    def fault_response(self, status: int) -> web.Response:
        from .http import error_page

        return error_page(status)

    def throttled_response(self) -> web.Response:
        response = self.fault_response(429)
        # a throttled IMDS client must slow down, not retry at once
        response.headers["Retry-After"] = "1"
        return response

    def finish(self, response: web.StreamResponse, faults: CountedFaults) -> None:
        response.headers["Server"] = "EC2ws"

    def execute(
        self, sim: RunningSimulator, action: str, params: dict[str, Any], at: float
    ) -> None:
        aws = sim.state_of(self.name, AwsState)
        if action == "aws.spot":
            action_name = str(params.get("spot_action", "terminate"))
            aws.interrupt(action_name, float(params.get("time_in", 120.0)), at=at)
        elif action == "aws.spot.clear":
            aws.clear_spot()
        elif action == "aws.rebalance":
            aws.recommend_rebalance(at=at)
        elif action == "aws.rebalance.clear":
            aws.clear_rebalance()
        elif action == "aws.event":
            aws.add_event(**params, at=at)
        elif action == "aws.event.state":
            aws.set_event_state(str(params["event_id"]), str(params["state"]))
        elif action == "aws.event.complete":
            aws.complete_event(str(params["event_id"]))
        elif action == "aws.event.cancel":
            aws.cancel_event(str(params["event_id"]))
        elif action == "aws.event.remove":
            aws.remove_event(str(params["event_id"]))
        elif action == "aws.lifecycle":
            aws.set_lifecycle(params["state"] or None)
        elif action == "aws.tokens.expire":
            aws.expire_tokens()


SIMULATED: Final = SimulatedAws()
