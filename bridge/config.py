"""The configuration file (TOML), its environment overrides, and its validation.

Every key is typed; an unknown key or a bad value is an error whose message names the key's
path (`sinks[0].url: ...`), because a sidecar that silently ignores a typo in `poll_interval`
is worse than one that refuses to start. Any key can be overridden from the environment as
`MAINTENANCE_BRIDGE__<SECTION>__<KEY>` (for example
`MAINTENANCE_BRIDGE__SOURCE__AZURE__POLL_INTERVAL=0.5` or `MAINTENANCE_BRIDGE__SINKS__0__URL`),
which is how container platforms usually inject settings.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeVar

import msgspec

from bridge import sink_registry
from bridge.actions.coordination.settings import Coordination
from bridge.contract import ProviderName
from bridge.infra import platform
from bridge.infra.credential import IdentitySettings
from bridge.infra.tracing import TracingSettings
from bridge.infra.validation import ConfigError as ConfigError
from bridge.infra.validation import FieldError, render_path, validate_into
from bridge.providerapi import registry as providers
from bridge.providerapi.settings import ProviderSettings
from bridge.sinkapi import SinkConfig

CONFIG_ENV: Final = "MAINTENANCE_BRIDGE_CONFIG"
ENV_PREFIX: Final = "MAINTENANCE_BRIDGE__"

Positive = Annotated[float, msgspec.Meta(gt=0)]
_Settings = TypeVar("_Settings", bound=ProviderSettings)
NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """A table of the file: unknown keys are errors and the values never change.

    Subclasses repeat `frozen=True, kw_only=True`: msgspec inherits them, type checkers don't.
    """


class _SourceTable(_Section, frozen=True, kw_only=True):
    """`[source]`: which cloud to watch, and one table per registered provider
    (`[source.<name>]`, its model in `bridge/providers/<name>/settings.py`), added as fields
    by `_source_model` from the registry so that a new provider adds no line here."""

    provider: Literal["auto", ProviderName] = "auto"
    detect_timeout: Positive = 2.0

    if TYPE_CHECKING:
        # The providers' tables are fields made at run time (`_source_model`).
        def __getattr__(self, name: str) -> Any: ...

    def section(self, name: ProviderName, model: type[_Settings]) -> _Settings:
        """`[source.<name>]`, typed: what a provider reads its own settings with."""
        found = getattr(self, name)
        if not isinstance(found, model):
            raise TypeError(f"source.{name} is a {type(found).__name__}, not a {model.__name__}")
        return found


def _source_model() -> type[_SourceTable]:
    """`[source]` with a `[source.<name>]` field per registered provider, in the registry's
    order (so validation lists their problems in that order), each defaulting to its model's
    defaults."""
    fields = []
    for name in providers.names():
        model = providers.settings_model(name)
        fields.append((name, model, model()))
    source = msgspec.defstruct(
        "Source",
        fields,
        bases=(_SourceTable,),
        module=__name__,
        frozen=True,
        kw_only=True,
        forbid_unknown_fields=True,
    )
    assert issubclass(source, _SourceTable)
    return source


if TYPE_CHECKING:
    Source = _SourceTable
else:
    Source = _source_model()


class State(_Section, frozen=True, kw_only=True):
    #: /var/lib/maintenance-bridge; %ProgramData%\maintenance-bridge\state on Windows.
    dir: Path = platform.current().default_state_dir()


class Delivery(_Section, frozen=True, kw_only=True):
    retry_initial: Positive = 0.5  # first backoff, seconds
    retry_max: Positive = 60.0  # backoff cap, seconds
    shutdown_timeout: NonNegative = 10.0
    #: Per sink; older overflow goes to the dead letters.
    max_pending: Annotated[int, msgspec.Meta(ge=1)] = 100_000
    #: /healthz fails once the spool has failed to be written (or read) for this long.
    spool_failure_timeout: Positive = 300.0


class Listener(_Section, frozen=True, kw_only=True):
    """The bridge's one HTTP listener: metrics, health, readiness and the status API."""

    enabled: bool = True
    host: str = "127.0.0.1"  # loopback unless a probe must reach it
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 9787  # 0 picks a free port


NoticeKind = Literal[
    "live-migrate", "terminate", "freeze", "reboot", "redeploy", "preempt", "delete", "unknown"
]
NoticeStatus = Literal["scheduled", "started", "completed", "cancelled"]


class Hook(_Section, frozen=True, kw_only=True):
    """A local command run for matching notices (actions/hooks.py); empty filters match all."""

    name: str = ""  # default: the command's file name
    #: Argument list, no shell.
    command: Annotated[tuple[str, ...], msgspec.Meta(min_length=1)]
    statuses: tuple[NoticeStatus, ...] = ()
    kinds: tuple[NoticeKind, ...] = ()
    providers: tuple[ProviderName, ...] = ()
    timeout: Positive = 60.0  # seconds; then the process group dies
    #: Finish this many seconds before not_before.
    deadline_before: NonNegative | None = None
    #: A disruptive action: take a slot of the [coordination] budget before running.
    budget: bool = False
    #: No slot before the deadline: run anyway, or skip the hook.
    on_budget_timeout: Literal["run", "skip"] = "run"

    def __post_init__(self) -> None:
        if not self.command[0]:
            raise FieldError("command", "the program (first element) must not be empty")

    def display_name(self) -> str:
        return self.name or Path(self.command[0]).name


ApprovalAction = Literal["approve", "approve-after-hooks", "never"]
Duration = Annotated[int, msgspec.Meta(ge=0)]


class ApprovalRule(_Section, frozen=True, kw_only=True):
    """Matched against a Scheduled Azure event; the first matching rule decides."""

    event_types: tuple[Literal["Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"], ...] = ()
    sources: tuple[Literal["User", "Platform"], ...] = ()
    min_duration: Duration | None = None  # DurationInSeconds >= this
    max_duration: Duration | None = None  # DurationInSeconds <= this
    action: ApprovalAction

    def __post_init__(self) -> None:
        if (
            self.min_duration is not None
            and self.max_duration is not None
            and self.min_duration > self.max_duration
        ):
            raise ValueError("min_duration is greater than max_duration")


class Approval(_Section, frozen=True, kw_only=True):
    """Azure StartRequests (bridge/actions/approval.py). No rules and no preset: never approve."""

    leader: Literal["sorted-first", "self", "none"] = "sorted-first"
    preset: Literal["vendor-sample"] | None = None
    rules: tuple[ApprovalRule, ...] = ()


class StatusApi(_Section, frozen=True, kw_only=True):
    """The local status API (`/v1/notices`, `/v1/eligible`) on the listener."""

    #: Seconds; maintenance sooner than this: not eligible.
    eligible_horizon: NonNegative = 3600.0


class HeartbeatSettings(_Section, frozen=True, kw_only=True):
    """`[heartbeat]`: io.maintenancebridge.agent.heartbeat at start and every `interval`
    seconds (see bridge/pipeline/heartbeat.py); 0 sends none."""

    interval: NonNegative = 300.0


class Config(_Section, frozen=True, kw_only=True):
    source: Source = Source()
    state: State = State()
    heartbeat: HeartbeatSettings = HeartbeatSettings()
    delivery: Delivery = Delivery()
    listener: Listener = Listener()
    sinks: tuple[SinkConfig, ...] = ()
    hooks: tuple[Hook, ...] = ()
    approval: Approval = Approval()
    status: StatusApi = StatusApi()
    #: The fleet's maintenance budget (bridge/actions/coordination); None: every VM acts alone.
    coordination: Coordination | None = None
    #: Enrollment with the fleet by the cloud's identity document (bridge/pipeline/enrollment).
    identity: IdentitySettings | None = None
    #: OpenTelemetry export of each event's spans (bridge/infra/tracing.py); None: none.
    tracing: TracingSettings | None = None

    def action_problems(self) -> list[str]:
        """Hook and approval settings that are valid one by one but not together."""
        problems = []
        names = [hook.display_name() for hook in self.hooks]
        for name in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"hooks: the name {name!r} is used twice; give each hook a `name`")
        for index, rule in enumerate(self.approval.rules):
            if rule.action == "approve-after-hooks" and not self.hooks:
                problems.append(
                    f"approval.rules[{index}].action: approve-after-hooks needs [[hooks]]"
                )
        for index, hook in enumerate(self.hooks):
            if hook.budget and self.coordination is None:
                problems.append(f"hooks[{index}].budget: needs a [coordination] table")
        return problems

    def with_sinks(self, sinks: tuple[SinkConfig, ...]) -> Config:
        """This configuration with `sinks` (already validated) instead of its own."""
        return msgspec.structs.replace(self, sinks=sinks)

    def sink_names(self) -> list[str]:
        return [sink.display_name(i) for i, sink in enumerate(self.sinks)]


def read_toml(path: Path | None) -> dict[str, Any]:
    """The parsed file (empty without one); `ConfigError` naming the file when it cannot be
    read, is not UTF-8 or is not TOML (the fleet service's configuration reads through it)."""
    if path is None:
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(["file not found"], str(path)) from None
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text (byte {exc.start}); save the file as UTF-8"
        raise ConfigError([problem], str(path)) from None
    except OSError as exc:
        raise ConfigError([f"cannot read: {exc.strerror}"], str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"not valid TOML: {exc}"], str(path)) from None


def _env_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


_LISTS: Final = ("sinks", "hooks", "rules")  # arrays of tables: indexed from the environment


def apply_env_overrides(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Overlay `MAINTENANCE_BRIDGE__A__B=value` onto the parsed file."""
    for name, text in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        keys = [part.lower() for part in name[len(ENV_PREFIX) :].split("__") if part]
        node: Any = raw
        for depth, key in enumerate(keys):
            last = depth == len(keys) - 1
            if isinstance(node, list):
                if not key.isdigit():
                    raise ConfigError([f"{name}: {key!r} is not a list index"], "environment")
                index = int(key)
                while len(node) <= index:
                    node.append({})
                if last:
                    node[index] = _env_value(text)
                else:
                    node = node[index]
            elif isinstance(node, dict):
                if last:
                    node[key] = _env_value(text)
                else:
                    node = node.setdefault(key, [] if key in _LISTS else {})
            else:
                raise ConfigError([f"{name}: cannot set a key inside a value"], "environment")
    return raw


def parse_config(raw: Mapping[str, Any], source: str = "configuration") -> Config:
    """Validate a parsed TOML document; raise `ConfigError` listing every problem."""
    data = dict(raw)
    # The fleet service's tables: one file may hold both (`fleet validate-config` checks them).
    data.pop("fleet", None)
    sinks_raw = data.pop("sinks", [])
    problems: list[str] = []
    config = validate_into(problems, Config, data)
    if config is not None:
        problems += config.action_problems()
    sinks: list[SinkConfig] = []
    if not isinstance(sinks_raw, list):
        problems.append("sinks: must be an array of tables ([[sinks]])")
        sinks_raw = []
    for index, entry in enumerate(sinks_raw):
        at = ("sinks", index)
        if not isinstance(entry, dict):
            problems.append(f"{render_path(at)}: must be a table")
            continue
        sink_type = entry.get("type")
        if not isinstance(sink_type, str):
            known = ", ".join(sink_registry.known_types())
            problems.append(f"{render_path(at)}.type: required (one of: {known})")
            continue
        try:
            model = sink_registry.config_model(sink_type)
        except sink_registry.UnknownSinkTypeError as exc:
            problems.append(f"{render_path(at)}.type: {exc}")
            continue
        sink = validate_into(problems, model, entry, at)
        if sink is not None:
            sinks.append(sink)
    names = [sink.display_name(i) for i, sink in enumerate(sinks)]
    for name in {n for n in names if names.count(n) > 1}:
        problems.append(f"sinks: the name {name!r} is used twice; give each sink a unique name")
    if problems or config is None:
        raise ConfigError(problems, source)
    return config.with_sinks(tuple(sinks))


def load_config(
    path: Path | None, environ: Mapping[str, str] = os.environ
) -> tuple[Config, Path | None]:
    """Read `path` (or $MAINTENANCE_BRIDGE_CONFIG), apply environment overrides, validate."""
    if path is None and environ.get(CONFIG_ENV):
        path = Path(environ[CONFIG_ENV])
    raw: dict[str, Any] = {}
    source = "configuration"
    if path is not None:
        source = str(path)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(["file not found"], source) from None
        except UnicodeDecodeError as exc:
            problem = f"not UTF-8 text (byte {exc.start}); save the file as UTF-8"
            raise ConfigError([problem], source) from None
        except OSError as exc:
            raise ConfigError([f"cannot read: {exc.strerror}"], source) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError([f"not valid TOML: {exc}"], source) from None
    raw = apply_env_overrides(raw, environ)
    try:
        return parse_config(raw, source), path
    except ConfigError as exc:
        raise blame_environment(exc, environ) from None


def blame_environment(error: ConfigError, environ: Mapping[str, str]) -> ConfigError:
    """`error` with each problem of a key set by an environment override naming the variable
    (the file did not say it; the variable did)."""
    overridden: dict[str, str] = {}
    for name in environ:
        if name.startswith(ENV_PREFIX):
            parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
            loc = tuple(int(p) if p.isdigit() else p for p in parts)
            overridden[render_path(loc)] = name
    problems = []
    blamed = 0
    for problem in error.problems:
        key = problem.split(": ", 1)[0]
        variable = next(
            (
                var
                for path, var in sorted(overridden.items(), key=lambda item: -len(item[0]))
                if key == path or key.startswith((path + ".", path + "["))
            ),
            None,
        )
        if variable is not None:
            blamed += 1
            problem = f"{problem} (set by the environment variable {variable})"
        problems.append(problem)
    source = "environment" if blamed and blamed == len(problems) else error.source
    return ConfigError(problems, source)
