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
from typing import Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sinks import registry
from sinks.base import SinkConfig

CONFIG_ENV: Final = "MAINTENANCE_BRIDGE_CONFIG"
ENV_PREFIX: Final = "MAINTENANCE_BRIDGE__"
GCE_DEFAULT_URL: Final = "http://metadata.google.internal/computeMetadata/v1/"
AZURE_DEFAULT_URL: Final = "http://169.254.169.254/metadata/"


class ConfigError(Exception):
    """A configuration that cannot be used; `problems` lists `path: message` lines."""

    def __init__(self, problems: list[str], source: str = "configuration") -> None:
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: " + "; ".join(problems))

    def render(self) -> str:
        lines = [f"invalid {self.source}:"]
        lines += [f"  {problem}" for problem in self.problems]
        return "\n".join(lines)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _base_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError("must be an http:// URL")
    return value if value.endswith("/") else value + "/"


class GceSource(_Section):
    metadata_url: str | None = Field(
        default=None,
        description="Base URL; default from GCE_METADATA_HOST, else metadata.google.internal",
    )
    long_poll_timeout: int = Field(default=60, ge=1, le=3600)
    watch_preempted: bool = True
    watch_upcoming: bool = True
    upcoming_poll_interval: float = Field(default=30.0, gt=0)

    _check_url = field_validator("metadata_url")(
        lambda value: None if value is None else _base_url(value)
    )

    def resolved_url(self, environ: Mapping[str, str] = os.environ) -> str:
        """Explicit config first, then GCE_METADATA_HOST (as Google's libraries do)."""
        if self.metadata_url:
            return self.metadata_url
        host = environ.get("GCE_METADATA_HOST")
        if host:
            return f"http://{host}/computeMetadata/v1/"
        return GCE_DEFAULT_URL


class AzureSource(_Section):
    imds_url: str = AZURE_DEFAULT_URL
    poll_interval: float = Field(default=1.0, ge=0.2, description="IMDS allows 5 requests/s")
    api_version: str = "2020-07-01"
    request_timeout: float = Field(default=10.0, gt=0)
    first_call_timeout: float = Field(default=150.0, gt=0)

    _check_url = field_validator("imds_url")(_base_url)


class Source(_Section):
    provider: Literal["auto", "gce", "azure"] = "auto"
    detect_timeout: float = Field(default=2.0, gt=0)
    gce: GceSource = GceSource()
    azure: AzureSource = AzureSource()


class State(_Section):
    dir: Path = Path("/var/lib/maintenance-bridge")


class Delivery(_Section):
    retry_initial: float = Field(default=0.5, gt=0, description="first backoff, seconds")
    retry_max: float = Field(default=60.0, gt=0, description="backoff cap, seconds")
    shutdown_timeout: float = Field(default=10.0, ge=0)
    max_pending: int = Field(
        default=100_000, ge=1, description="per sink; older overflow goes to the dead letters"
    )


class Listener(_Section):
    """The bridge's one HTTP listener: metrics, health, readiness and the status API."""

    enabled: bool = True
    host: str = Field(default="127.0.0.1", description="loopback unless a probe must reach it")
    port: int = Field(default=9787, ge=0, le=65535, description="0 picks a free port")


NoticeKind = Literal[
    "live-migrate", "terminate", "freeze", "reboot", "redeploy", "preempt", "delete", "unknown"
]
NoticeStatus = Literal["scheduled", "started", "completed", "cancelled"]


class Hook(_Section):
    """A local command run for matching notices (see bridge/hooks.py); empty filters match all."""

    name: str = Field(default="", description="default: the command's file name")
    command: tuple[str, ...] = Field(min_length=1, description="argument list, no shell")
    statuses: tuple[NoticeStatus, ...] = ()
    kinds: tuple[NoticeKind, ...] = ()
    providers: tuple[Literal["gce", "azure"], ...] = ()
    timeout: float = Field(default=60.0, gt=0, description="seconds; then the process group dies")
    deadline_before: float | None = Field(
        default=None, ge=0, description="finish this many seconds before not_before"
    )

    @field_validator("command")
    @classmethod
    def _non_empty_program(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value[0]:
            raise ValueError("the program (first element) must not be empty")
        return value

    def display_name(self) -> str:
        return self.name or Path(self.command[0]).name


ApprovalAction = Literal["approve", "approve-after-hooks", "never"]


class ApprovalRule(_Section):
    """Matched against a Scheduled Azure event; the first matching rule decides."""

    event_types: tuple[Literal["Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"], ...] = ()
    sources: tuple[Literal["User", "Platform"], ...] = ()
    min_duration: int | None = Field(default=None, ge=0, description="DurationInSeconds >= this")
    max_duration: int | None = Field(default=None, ge=0, description="DurationInSeconds <= this")
    action: ApprovalAction

    @model_validator(mode="after")
    def _range(self) -> ApprovalRule:
        if (
            self.min_duration is not None
            and self.max_duration is not None
            and self.min_duration > self.max_duration
        ):
            raise ValueError("min_duration is greater than max_duration")
        return self


class Approval(_Section):
    """Azure StartRequests (see bridge/approval.py). No rules and no preset: never approve."""

    leader: Literal["sorted-first", "self", "none"] = "sorted-first"
    preset: Literal["vendor-sample"] | None = None
    rules: tuple[ApprovalRule, ...] = ()


class StatusApi(_Section):
    """The local status API (`/v1/notices`, `/v1/eligible`) on the listener."""

    eligible_horizon: float = Field(
        default=3600.0, ge=0, description="seconds; maintenance sooner than this: not eligible"
    )


class Config(_Section):
    source: Source = Source()
    state: State = State()
    delivery: Delivery = Delivery()
    listener: Listener = Listener()
    sinks: tuple[SinkConfig, ...] = ()
    hooks: tuple[Hook, ...] = ()
    approval: Approval = Approval()
    status: StatusApi = StatusApi()

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
        return problems

    def sink_names(self) -> list[str]:
        return [sink.display_name(i) for i, sink in enumerate(self.sinks)]


def _path(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _problems(error: ValidationError, prefix: tuple[int | str, ...] = ()) -> list[str]:
    problems = []
    for item in error.errors():
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        message = message.removeprefix("Value error, ")
        problems.append(f"{_path(prefix + tuple(item['loc']))}: {message}")
    return problems


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
    sinks_raw = data.pop("sinks", [])
    problems: list[str] = []
    config = Config()
    try:
        config = Config.model_validate(data)
        problems += config.action_problems()
    except ValidationError as exc:
        problems += _problems(exc)
    sinks: list[SinkConfig] = []
    if not isinstance(sinks_raw, list):
        problems.append("sinks: must be an array of tables ([[sinks]])")
        sinks_raw = []
    for index, entry in enumerate(sinks_raw):
        if not isinstance(entry, dict):
            problems.append(f"sinks[{index}]: must be a table")
            continue
        sink_type = entry.get("type")
        if not isinstance(sink_type, str):
            problems.append(f"sinks[{index}].type: required (one of {registry.known_types()})")
            continue
        try:
            model = registry.config_model(sink_type)
            sinks.append(model.model_validate(entry))
        except registry.UnknownSinkTypeError as exc:
            problems.append(f"sinks[{index}].type: {exc}")
        except ValidationError as exc:
            problems += _problems(exc, ("sinks", index))
    names = [sink.display_name(i) for i, sink in enumerate(sinks)]
    for name in {n for n in names if names.count(n) > 1}:
        problems.append(f"sinks: the name {name!r} is used twice; give each sink a unique name")
    if problems:
        raise ConfigError(problems, source)
    return config.model_copy(update={"sinks": tuple(sinks)})


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
        except OSError as exc:
            raise ConfigError([f"cannot read: {exc.strerror}"], source) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError([f"not valid TOML: {exc}"], source) from None
    raw = apply_env_overrides(raw, environ)
    return parse_config(raw, source), path
