"""The sink plug-in surface: everything a sink (built-in or third-party) needs, from one place.

A sink module imports from here only: the `Sink` interface and the outcomes it reports
(`Ok`, `Retry`, `Reject`, `Result`, `Health`; `Encoded`, an event as the spool holds it),
the configuration base `SinkConfig` with the field types and errors its checks use
(`Secret`, `HttpUrl`, `FieldError`, `ConfigError`) and `validate` (how the bridge builds a
`Config`; a sink's tests call it too), and the wire format of the events it sends
(`serialize`, `parse`, `as_dict`; `dumps` for a binary-mode body and `json_format` for the
SDK's bindings, so that every sink writes the contract's one JSON form). What a sink shares
with the fleet's sources about one wire (a binding, signatures, connection settings) is in
`bridge.transports`.

A sink only talks to its bus: it classifies each attempt as `Ok`, `Retry` or `Reject` and
never sleeps, retries or spools. The dispatcher owns retries, backoff, the spool and the
dead-letter table, so every sink gets the same delivery guarantees for free, and a sink that
swallowed failures (a "send" that logs and returns) cannot exist here.

The bridge finds sinks through `bridge.sink_registry`, which names the built-in ones
(`sinks/`) by module and loads them with importlib: the sinks import the bridge, never the
other way round (tests/test_layers.py checks it). `sinks.api` re-exports this surface for
plug-ins written against its first name.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Final, Protocol

import msgspec
from cloudevents.core.v1.event import CloudEvent

from bridge.infra.credential import CredentialSource, EnrollmentPending
from bridge.infra.encoding import as_dict, dumps, json_format, parse, serialize
from bridge.infra.secrets import Secret
from bridge.infra.validation import ConfigError, FieldError, HttpUrl, validate

if TYPE_CHECKING:
    from bridge.infra.tls import ReloadingContext

__all__ = [
    "ENROLL_RETRY_AFTER",
    "ConfigError",
    "CredentialSource",
    "Encoded",
    "FieldError",
    "Health",
    "HttpUrl",
    "Ok",
    "Reject",
    "Result",
    "Retry",
    "Secret",
    "Sink",
    "SinkClosedError",
    "SinkConfig",
    "as_dict",
    "dumps",
    "instance_credential",
    "json_format",
    "parse",
    "serialize",
    "validate",
]


@dataclass(frozen=True, slots=True)
class Ok:
    """The bus acknowledged every event of the batch."""


@dataclass(frozen=True, slots=True)
class Retry:
    """A transient failure: try the same batch again, not before `after` seconds if given."""

    reason: str
    after: float | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """A permanent failure: the batch will never be accepted as it is (dead-letter it)."""

    reason: str


Result = Ok | Retry | Reject

#: Seconds between delivery attempts while the sidecar is not enrolled with the fleet.
ENROLL_RETRY_AFTER: Final = 5.0


async def instance_credential(enrollment: CredentialSource | None) -> str | Retry | None:
    """The sidecar's credential (`[identity]`, bridge/pipeline/enrollment.py) that a sink
    carries with its messages (the webhook's header, a bus message's `bridgecredential`
    attribute): None when identity is not configured (the runner sets a sink's
    `enrollment` only then); a `Retry` while the sidecar is not enrolled, so its events wait
    in the spool and none goes out unattested."""
    if enrollment is None:
        return None
    try:
        return await enrollment.credential()
    except EnrollmentPending as exc:
        return Retry(f"not enrolled with the fleet yet: {exc}", ENROLL_RETRY_AFTER)


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    detail: str


class Encoded(Protocol):
    """One event as the spool holds it: its id and its structured-mode JSON (`serialize`'s
    bytes). What the dispatcher hands to `Sink.publish_encoded`."""

    @property
    def id(self) -> str: ...

    @property
    def body(self) -> bytes: ...


class SinkClosedError(RuntimeError):
    """Raised by `publish` after `close`: a programming error, not a delivery failure."""


class SinkConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """Keys every `[[sinks]]` entry accepts; each sink adds its own and forbids the rest.

    A sink's `Config` is a subclass declared `frozen=True, kw_only=True` (msgspec inherits
    them, type checkers don't; and its required keys follow `name`), narrows `type` to
    `Literal["<its type>"]` and is built by `bridge.infra.validation.validate`; its own checks go
    in `__post_init__` (see that module).
    """

    type: str
    name: str | None = None

    def display_name(self, index: int) -> str:
        """The name used in logs, metrics and the spool: `name`, else `<type>` or `<type>-<n>`."""
        if self.name:
            return self.name
        return self.type if index == 0 else f"{self.type}-{index}"


class Sink(abc.ABC):
    """Base class of all sinks: closing is idempotent and publishing after close is refused."""

    #: How many events the dispatcher may hand to one `publish` call.
    max_batch: ClassVar[int] = 1

    def __init__(self, name: str) -> None:
        self.name = name
        self._closed = False

    async def publish(self, batch: Sequence[CloudEvent]) -> Result:
        """Deliver `batch` in order and say how it went; never raises for delivery failures."""
        if not self._has_work(batch):
            return Ok()
        return await self._publish(batch)

    async def publish_encoded(self, batch: Sequence[Encoded]) -> Result:
        """`publish` for events as the spool holds them (what the dispatcher calls).

        By default each event is parsed and handed to `_publish`. A sink whose wire format
        is the stored structured JSON itself (a structured-mode webhook, the file and stdout
        sinks) overrides `_publish_encoded` and sends those bytes as they are: parsing them
        back only to serialize them again costs more per event than a webhook POST's own
        protocol work, and the bytes sent are the same.
        """
        if not self._has_work(batch):
            return Ok()
        return await self._publish_encoded(batch)

    def _has_work(self, batch: Sized) -> bool:
        """Whether `batch` holds anything to send; `SinkClosedError` once the sink is closed."""
        if self._closed:
            raise SinkClosedError(f"sink {self.name!r} is closed")
        return bool(batch)

    async def _publish_encoded(self, batch: Sequence[Encoded]) -> Result:
        return await self._publish([parse(item.body) for item in batch])

    async def close(self, timeout: float) -> None:
        """Flush within `timeout` and release the connection; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        await self._close(timeout)

    async def healthcheck(self) -> Health:
        """Whether the target is reachable and accepts our credentials (for readiness/doctor)."""
        return Health(True, "no check for this sink")

    def client_certificate(self) -> ReloadingContext | None:
        """The certificate files the sink presents to its receiver (mutual TLS), for `doctor`
        to name and date; None for a sink without one."""
        return None

    @property
    def closed(self) -> bool:
        return self._closed

    @abc.abstractmethod
    async def _publish(self, batch: Sequence[CloudEvent]) -> Result: ...

    async def _close(self, timeout: float) -> None:
        """Release resources; called once."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
