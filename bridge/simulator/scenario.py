"""Scenario files: a named, scripted timeline of maintenance notices (TOML).

A scenario is data, not code, so users can write their own and pass a path.  Times (``at``,
``*_in``) are in simulated seconds and use the vendors' real notice periods; ``--speed``
compresses them.  See docs/simulator.md for the format.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

PROVIDERS = ("gce", "azure", "both", "aws", "all")

# action -> (required params, optional params)
ACTIONS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
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
    "fault.set": (
        frozenset(),
        frozenset(
            {
                "provider",
                "status_burst",
                "latency",
                "drop",
                "malformed",
                "hang",
                "rate_limit",
                "missing_vendor_header",
                "redirect",
            }
        ),
    ),
    "fault.clear": (frozenset(), frozenset({"provider"})),
    "log": (frozenset(), frozenset()),
}
_STEP_KEYS = frozenset({"at", "action", "note", "unwatched_delay"})


class ScenarioError(ValueError):
    """A scenario file that does not follow the documented format."""


@dataclass(frozen=True)
class Step:
    at: float
    action: str
    params: dict[str, Any]
    note: str = ""
    unwatched_delay: float | None = None
    """GCE 60-second-warning rule: if instance/maintenance-event was not queried since the
    last event when this step fires, it is postponed by this many sim seconds (the notice is
    skipped and the value appears only when the event begins)."""

    def describe(self) -> str:
        """The note if the author wrote one, else the action and its parameters."""
        if self.note:
            return f"{self.action}: {self.note}"
        details = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{self.action}({details})" if details else self.action


@dataclass(frozen=True)
class Scenario:
    name: str
    provider: str
    description: str = ""
    identity: dict[str, Any] = field(default_factory=dict)
    quirks: dict[str, dict[str, Any]] = field(default_factory=dict)
    gce_initial: dict[str, str] = field(default_factory=dict)
    steps: tuple[Step, ...] = ()
    source: str = ""

    @property
    def duration(self) -> float:
        """Sim time of the last step."""
        return max((s.at for s in self.steps), default=0.0)


class ScenarioInfo(NamedTuple):
    name: str
    description: str


def _scenario_dir() -> Path:
    return Path(str(resources.files(__package__ or "bridge.simulator").joinpath("scenarios")))


def list_scenarios() -> list[ScenarioInfo]:
    """Names and descriptions of the scenarios shipped in the package, sorted by name."""
    out = []
    for path in sorted(_scenario_dir().glob("*.toml")):
        scenario = load_scenario(path)
        out.append(ScenarioInfo(scenario.name, scenario.description))
    return out


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load a shipped scenario by name, or any scenario file by path."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        shipped = _scenario_dir() / f"{name_or_path}.toml"
        if not shipped.exists():
            known = ", ".join(p.stem for p in sorted(_scenario_dir().glob("*.toml")))
            raise ScenarioError(f"unknown scenario {name_or_path!r}; shipped: {known}")
        path = shipped
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ScenarioError(f"{path}: {exc}") from exc
    return parse_scenario(data, source=str(path), default_name=path.stem)


def parse_scenario(data: dict[str, Any], *, source: str = "", default_name: str = "") -> Scenario:
    """Validate a scenario mapping (as read from TOML) and build a :class:`Scenario`."""
    where = source or "scenario"
    allowed = {"name", "provider", "description", "identity", "quirks", "gce", "steps"}
    unknown = set(data) - allowed
    if unknown:
        raise ScenarioError(f"{where}: unknown top-level keys {sorted(unknown)}")
    provider = data.get("provider", "both")
    if provider not in PROVIDERS:
        raise ScenarioError(f"{where}: provider must be one of {PROVIDERS}")
    quirks = data.get("quirks", {})
    if set(quirks) - {"gce", "azure", "aws"}:
        raise ScenarioError(
            f"{where}: [quirks] takes [quirks.gce], [quirks.azure] and [quirks.aws] tables"
        )
    identity = data.get("identity", {})
    if set(identity) - {"gce", "azure", "aws"}:
        raise ScenarioError(
            f"{where}: [identity] takes [identity.gce], [identity.azure] and [identity.aws]"
        )
    gce = data.get("gce", {})
    if set(gce) - {"initial"}:
        raise ScenarioError(f"{where}: [gce] only takes an [gce.initial] table")
    steps = [
        _parse_step(raw, f"{where}: step {i + 1}") for i, raw in enumerate(data.get("steps", []))
    ]
    steps.sort(key=lambda s: s.at)
    return Scenario(
        name=str(data.get("name", default_name)),
        provider=provider,
        description=str(data.get("description", "")),
        identity=identity,
        quirks=quirks,
        gce_initial={str(k): str(v) for k, v in gce.get("initial", {}).items()},
        steps=tuple(steps),
        source=source,
    )


def _parse_step(raw: dict[str, Any], where: str) -> Step:
    if "at" not in raw or "action" not in raw:
        raise ScenarioError(f"{where}: needs 'at' and 'action'")
    action = raw["action"]
    if action not in ACTIONS:
        raise ScenarioError(f"{where}: unknown action {action!r}; known: {sorted(ACTIONS)}")
    at = raw["at"]
    if not isinstance(at, int | float) or at < 0:
        raise ScenarioError(f"{where}: 'at' must be a number of sim seconds >= 0")
    required, optional = ACTIONS[action]
    params = {k: v for k, v in raw.items() if k not in _STEP_KEYS}
    missing = required - set(params)
    if missing:
        raise ScenarioError(f"{where}: {action} needs {sorted(missing)}")
    extra = set(params) - required - optional
    if extra:
        raise ScenarioError(f"{where}: {action} does not take {sorted(extra)}")
    delay = raw.get("unwatched_delay")
    return Step(
        at=float(at),
        action=action,
        params=params,
        note=str(raw.get("note", "")),
        unwatched_delay=None if delay is None else float(delay),
    )
