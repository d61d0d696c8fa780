"""State of the simulated EC2 instance metadata service (IMDS) and how its answers look.

Shapes and defaults follow the vendor's instance-metadata pages and
aws/amazon-ec2-metadata-mock (AEMM): the Spot instance-action `{"action", "time"}` with the
time two minutes ahead, the rebalance recommendation `{"noticeTime"}` at the moment it is
issued, scheduled events as a JSON array with times like `21 Jan 2019 09:00:43 GMT`
(AEMM's defaults: `system-reboot`, `active`, NotBefore now, NotAfter in 7 days,
NotBeforeDeadline in 9 days), the Auto Scaling target lifecycle state starting `InService`.
Two deliberate differences from AEMM: the Spot time is fixed when the notice is issued (AEMM
recomputes it per request; the real service does not), and notices appear when a scenario
step or the control API says so (AEMM's `--mock-delay-sec N` is a step at `at = N`).

Session tokens expire on the *simulated* clock, so a test can jump past a token's TTL.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bridge.simulator.clock import SimClock, rfc3339

MAX_TOKEN_TTL = 21600
SPOT_ACTIONS = ("terminate", "stop", "hibernate")
EVENT_CODES = (
    "instance-reboot",
    "system-reboot",
    "system-maintenance",
    "instance-retirement",
    "instance-stop",
)
LIFECYCLE_STATES = (
    "InService",
    "Terminated",
    "Standby",
    "Detached",
    "Warmed:Pending",
    "Warmed:Running",
    "Warmed:Stopped",
    "Warmed:Hibernated",
    "Warmed:Terminated",
)
DEFAULT_DESCRIPTIONS = {
    "instance-reboot": "The instance is scheduled for a reboot",
    "system-reboot": "scheduled reboot",
    "system-maintenance": "The instance is scheduled for system maintenance",
    "instance-retirement": "The instance is scheduled for retirement",
    "instance-stop": "The instance is scheduled for a stop",
}
DAY = 86400.0


def aws_time(epoch: float) -> str:
    """The scheduled-events time format, `21 Jan 2019 09:00:43 GMT`."""
    moment = datetime.fromtimestamp(int(epoch), tz=UTC)
    return f"{moment.day} {moment:%b %Y %H:%M:%S} GMT"


@dataclass(frozen=True)
class AwsIdentity:
    """The instance identity document's fields (defaults: aws/amazon-ec2-metadata-mock's, with
    the 12-digit account id of the AWS documentation's examples)."""

    instance_id: str = "i-1234567890abcdef0"
    account_id: str = "123456789012"
    region: str = "us-east-1"
    availability_zone: str = "us-east-1f"
    instance_type: str = "m4.xlarge"
    image_id: str = "ami-0a887e401f7654935"
    private_ip: str = "172.16.34.43"


class AwsQuirks:
    """Behaviors that depend on the instance's settings; switch them live."""

    def __init__(self) -> None:
        self.v2_required: bool = False
        """HttpTokens=required: a request without a token gets 401 (AEMM default: off)."""
        self.token_put_timeout: bool = False
        """The token PUT's answer never arrives: the hop-limit symptom in a container."""

    def as_dict(self) -> dict[str, Any]:
        return {"v2_required": self.v2_required, "token_put_timeout": self.token_put_timeout}

    def update(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if key == "v2_required":
                self.v2_required = bool(value)
            elif key == "token_put_timeout":
                self.token_put_timeout = bool(value)
            else:
                raise ValueError(f"unknown AWS quirk {key!r}")


@dataclass
class AwsEvent:
    event_id: str
    code: str
    description: str
    state: str
    not_before: str
    not_after: str
    not_before_deadline: str

    def render(self) -> dict[str, Any]:
        """One event, in the field order of the vendor's example."""
        out: dict[str, Any] = {
            "NotBefore": self.not_before,
            "Code": self.code,
            "Description": self.description,
            "EventId": self.event_id,
            "NotAfter": self.not_after,
            "State": self.state,
        }
        if self.not_before_deadline:
            out["NotBeforeDeadline"] = self.not_before_deadline
        return out


@dataclass
class AwsState:
    identity: AwsIdentity
    clock: SimClock
    notify: Callable[[], None]
    quirks: AwsQuirks = field(default_factory=AwsQuirks)
    spot: dict[str, str] | None = None
    rebalance: dict[str, str] | None = None
    lifecycle: str | None = "InService"
    events: list[AwsEvent] = field(default_factory=list)
    history: list[AwsEvent] = field(default_factory=list)
    #: token -> simulated time it expires at
    tokens: dict[str, float] = field(default_factory=dict)
    #: The first instance identity document served (what the `replayed` fault serves again).
    first_document: str | None = None

    # -- tokens ------------------------------------------------------------------------------
    def issue_token(self, ttl: int) -> str:
        token = secrets.token_urlsafe(42)
        self.tokens[token] = self.clock.now() + ttl
        return token

    def token_valid(self, token: str) -> bool:
        expires = self.tokens.get(token)
        if expires is None:
            return False
        if self.clock.now() >= expires:
            del self.tokens[token]
            return False
        return True

    def expire_tokens(self) -> int:
        """Invalidate every token issued so far (as an IMDS restart does); returns how many."""
        count = len(self.tokens)
        self.tokens.clear()
        return count

    # -- notices -----------------------------------------------------------------------------
    def _wall(self, at: float | None, offset: float) -> float:
        now = self.clock.now() if at is None else at
        return self.clock.wall_time_of(now + offset)

    def interrupt(
        self, action: str = "terminate", time_in: float = 120.0, *, at: float | None = None
    ) -> dict[str, str]:
        """Issue a Spot interruption notice; `time_in` sim seconds until the action."""
        if action not in SPOT_ACTIONS:
            raise ValueError(f"action must be one of {SPOT_ACTIONS}")
        self.spot = {"action": action, "time": rfc3339(self._wall(at, time_in))}
        self.notify()
        return self.spot

    def clear_spot(self) -> None:
        """The instance is back (after a stop or hibernation): the notice is gone."""
        self.spot = None
        self.notify()

    def recommend_rebalance(self, *, at: float | None = None) -> dict[str, str]:
        self.rebalance = {"noticeTime": rfc3339(self._wall(at, 0.0))}
        self.notify()
        return self.rebalance

    def clear_rebalance(self) -> None:
        self.rebalance = None
        self.notify()

    def set_lifecycle(self, state: str | None) -> None:
        """The Auto Scaling target lifecycle state; None: not in a group (404)."""
        if state is not None and state not in LIFECYCLE_STATES:
            raise ValueError(f"state must be one of {LIFECYCLE_STATES} or null")
        self.lifecycle = state
        self.notify()

    def find(self, event_id: str) -> AwsEvent | None:
        return next((e for e in self.events if e.event_id == event_id), None)

    def add_event(
        self,
        event_id: str | None = None,
        code: str = "system-reboot",
        description: str | None = None,
        state: str = "active",
        not_before_in: float = 0.0,
        not_after_in: float | None = 7 * DAY,
        deadline_in: float | None = 9 * DAY,
        *,
        at: float | None = None,
    ) -> str:
        """Schedule an event (AEMM's defaults); times in sim seconds from now. Returns its id.

        `not_after_in=None` leaves NotAfter empty, `deadline_in=None` omits
        NotBeforeDeadline (an event that cannot be rescheduled).
        """
        if code not in EVENT_CODES:
            raise ValueError(f"code must be one of {EVENT_CODES}")
        event_id = event_id or f"instance-event-{secrets.token_hex(9)[:17]}"
        if self.find(event_id) is not None:
            raise ValueError(f"event {event_id} already exists")
        event = AwsEvent(
            event_id=event_id,
            code=code,
            description=description or DEFAULT_DESCRIPTIONS[code],
            state=state,
            not_before=aws_time(self._wall(at, not_before_in)),
            not_after="" if not_after_in is None else aws_time(self._wall(at, not_after_in)),
            not_before_deadline=(
                "" if deadline_in is None else aws_time(self._wall(at, deadline_in))
            ),
        )
        self.events.append(event)
        self.notify()
        return event_id

    def _get(self, event_id: str) -> AwsEvent:
        event = self.find(event_id)
        if event is None:
            raise KeyError(event_id)
        return event

    def set_event_state(self, event_id: str, state: str) -> None:
        """Change an event's State in place (AWS documents only active, completed, canceled;
        other values exercise the client's handling of the undocumented)."""
        self._get(event_id).state = state
        self.notify()

    def _retire(self, event_id: str, state: str, prefix: str) -> None:
        event = self._get(event_id)
        self.events.remove(event)
        event.state = state
        event.description = f"{prefix} {event.description}"
        self.history.append(event)
        self.notify()

    def complete_event(self, event_id: str) -> None:
        """The event ran: it leaves the list and shows in the history as completed."""
        self._retire(event_id, "completed", "[Completed]")

    def cancel_event(self, event_id: str) -> None:
        """The event was canceled: it leaves the list and shows in the history as canceled."""
        self._retire(event_id, "canceled", "[Canceled]")

    def remove_event(self, event_id: str) -> None:
        """The event vanishes without a trace in the history (for the client's fallback)."""
        self.events.remove(self._get(event_id))
        self.notify()

    # -- read side ---------------------------------------------------------------------------
    def scheduled(self) -> list[dict[str, Any]]:
        return [e.render() for e in self.events]

    def past(self) -> list[dict[str, Any]]:
        return [e.render() for e in self.history]

    def snapshot(self) -> dict[str, Any]:
        return {
            "spot": self.spot,
            "rebalance": self.rebalance,
            "lifecycle": self.lifecycle,
            "scheduled": self.scheduled(),
            "history": self.past(),
            "tokens_live": sum(1 for t in list(self.tokens) if self.token_valid(t)),
            "quirks": self.quirks.as_dict(),
        }
