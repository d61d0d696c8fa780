"""Scenario files: a named, scripted timeline of maintenance notices (TOML).

A scenario is data, not code, so users can write their own and pass a path.  Times (``at``,
``*_in``) are in simulated seconds and use the vendors' real notice periods; ``--speed``
compresses them.  See docs/simulator.md for the format.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .faults import FIELDS
from .part import ActionParams, choices, names, part, parts

# action -> (required params, optional params), besides each provider's own
# (`SimulatedProvider.actions`, named `<provider>.<verb>`).
COMMON_ACTIONS: dict[str, ActionParams] = {
    "fault.set": (frozenset(), frozenset({"provider", *FIELDS})),
    "fault.clear": (frozenset(), frozenset({"provider"})),
    "log": (frozenset(), frozenset()),
}


def actions() -> dict[str, ActionParams]:
    """Every scenario action: the providers' and the common ones."""
    found: dict[str, ActionParams] = {}
    for simulated in parts():
        found.update(simulated.actions)
    return found | COMMON_ACTIONS


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
    #: A provider's own top-level table (`SimulatedProvider.parse_table`), by provider.
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
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
    # Imported here: every `maintenance-bridge` command builds the `simulate` parser, and
    # importlib.resources (tempfile, shutil, the compression modules) would cost each
    # running bridge 0.8 MiB for a directory only the simulator reads.
    from importlib import resources

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
    own = {p.name for p in parts() if p.scenario_table}
    allowed = {"name", "provider", "description", "identity", "quirks", "steps"} | own
    unknown = set(data) - allowed
    if unknown:
        raise ScenarioError(f"{where}: unknown top-level keys {sorted(unknown)}")
    provider = data.get("provider", "both")
    if provider not in choices():
        raise ScenarioError(f"{where}: provider must be one of {choices()}")
    quirks = data.get("quirks", {})
    if set(quirks) - set(names()):
        listed = _listed(f"[quirks.{name}]" for name in names())
        raise ScenarioError(f"{where}: [quirks] takes {listed} tables")
    identity = data.get("identity", {})
    if set(identity) - set(names()):
        listed = _listed(f"[identity.{name}]" for name in names())
        raise ScenarioError(f"{where}: [identity] takes {listed}")
    tables = {name: part(name).parse_table(data[name], where) for name in own if name in data}
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
        tables=tables,
        steps=tuple(steps),
        source=source,
    )


def _listed(items: Iterable[str]) -> str:
    """`a, b and c`."""
    words = list(items)
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]


def _parse_step(raw: dict[str, Any], where: str) -> Step:
    if "at" not in raw or "action" not in raw:
        raise ScenarioError(f"{where}: needs 'at' and 'action'")
    action = raw["action"]
    known = actions()
    if action not in known:
        raise ScenarioError(f"{where}: unknown action {action!r}; known: {sorted(known)}")
    at = raw["at"]
    if not isinstance(at, int | float) or at < 0:
        raise ScenarioError(f"{where}: 'at' must be a number of sim seconds >= 0")
    required, optional = known[action]
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
