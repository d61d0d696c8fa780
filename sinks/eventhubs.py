"""Publishes events to an Azure Event Hub as CloudEvents over AMQP (binary or structured mode).

The partition key is the event `source` (the VM), so all events of one VM land in one
partition, in order. Each dispatcher batch is grouped by partition key (keeping order) and
packed into the SDK's `EventDataBatch`es, which know the hub's real size limit; an event that
does not fit even into an empty batch can never be sent and is a `Reject`.

The SDK retries internally by default, which would hide an outage from the dispatcher (and
block shutdown for minutes), so the client is built with `retry_total=0` and every call is
bounded by `timeout`: each attempt is one try, and the dispatcher's backoff and spool do the
rest. A batch is `Ok` only once `send_batch` returned. When a batch spans several VMs and a
later group fails, the earlier groups were already delivered and are sent again on retry:
delivery is at least once, and consumers de-duplicate on `source` + `id`.

Instance identity: with `[identity]` configured, every message carries the sidecar's
credential as the application property ``bridgecredential`` (both modes;
`bridge.transports.eventhubs`), which the fleet's `eventhubs` source screens. A bus cannot
answer 401, so the sink never learns of a refusal: the credential is renewed before it
expires, not on a refusal.

`azure.eventhub` and `azure.identity` are imported only when a sink is constructed, so a
bridge without this sink never loads (or needs) the Azure SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Final, Literal

import msgspec
from cloudevents.core.v1.event import CloudEvent

from bridge.sinkapi import (
    CredentialSource,
    Health,
    Ok,
    Reject,
    Result,
    Retry,
    Secret,
    Sink,
    SinkConfig,
    instance_credential,
)
from bridge.transports.eventhubs import check_target, open_client, to_event_data

if TYPE_CHECKING:
    from azure.eventhub import EventDataBatch
    from azure.eventhub.aio import EventHubProducerClient
    from azure.identity.aio import DefaultAzureCredential

#: AMQP error conditions that no retry can fix: the hub, the namespace or our rights are wrong.
PERMANENT_CONDITIONS: Final = frozenset(
    {
        "not-found",
        "unauthorized-access",
        "not-allowed",
        "entity-disabled",
        "publisher-revoked",
        "message-size-exceeded",
        "decode-error",
        "invalid-field",
        "argument-error",
        "argument-out-of-range",
    }
)
_CONDITION: Final = re.compile(r"(?:amqp|com\.microsoft):(?:link:)?([a-z-]+)")


class Config(SinkConfig, frozen=True, kw_only=True):
    """`[[sinks]] type = "eventhubs"`: a connection string, or a namespace + hub with Azure AD."""

    type: Literal["eventhubs"] = "eventhubs"
    connection_string: Secret | None = None
    fully_qualified_namespace: str | None = None
    eventhub: str | None = None
    mode: Literal["binary", "structured"] = "binary"
    transport: Literal["amqp", "websockets"] = "amqp"
    timeout: Annotated[float, msgspec.Meta(gt=0)] = 10.0

    def __post_init__(self) -> None:
        check_target(self.connection_string, self.fully_qualified_namespace, self.eventhub)


def classify(exc: BaseException, what: str) -> Result:
    """Map an SDK failure to Retry / Reject (never raises)."""
    from azure.eventhub.exceptions import (
        AuthenticationError,
        ClientClosedError,
        ConnectError,
        EventDataError,
        EventHubError,
    )

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    condition = getattr(exc, "error", None)
    if not condition:
        match = _CONDITION.search(str(exc))
        condition = match.group(1) if match else None
    reason = f"{what}: {type(exc).__name__}: {text}"
    if condition:
        reason += f" (condition {condition})"
    if isinstance(exc, AuthenticationError):
        return Reject(
            f"{reason}; check the connection string, or that the identity has the "
            "'Azure Event Hubs Data Sender' role"
        )
    if condition in PERMANENT_CONDITIONS:
        if condition == "not-found":
            return Reject(f"{reason}; the event hub (or namespace) does not exist")
        return Reject(reason)
    if isinstance(exc, ClientClosedError):
        # Only our own close() closes the client, and publish after close is refused by the
        # base class: this is a shutdown race, the events stay spooled.
        return Retry(f"{reason}; the client was closed during the send")
    if isinstance(exc, EventDataError) and not isinstance(exc, ConnectError):
        return Reject(reason)
    if isinstance(exc, EventHubError | asyncio.TimeoutError | TimeoutError | OSError):
        return Retry(reason)
    return Retry(reason)


class EventHubsSink(Sink):
    """Sends batches with the async `EventHubProducerClient` (see the module docstring)."""

    max_batch = 100
    #: The sidecar's credential (`[identity]`), set by the runner; None: none is sent.
    enrollment: CredentialSource | None = None

    def __init__(self, name: str, config: Config) -> None:
        super().__init__(name)
        self.mode = config.mode
        self.timeout = config.timeout
        self._config = config
        self._credential: DefaultAzureCredential | None = None
        self._client: EventHubProducerClient = self._make_client()
        self.target = self._client.eventhub_name

    def _make_client(self) -> EventHubProducerClient:
        from azure.eventhub.aio import EventHubProducerClient

        config = self._config
        client, self._credential = open_client(
            EventHubProducerClient,
            config,
            retry_total=0,
            auth_timeout=max(1, round(config.timeout)),
        )
        return client

    async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
        credential = await instance_credential(self.enrollment)
        if isinstance(credential, Retry):
            return credential
        groups: dict[str, list[CloudEvent]] = {}
        for event in batch:
            groups.setdefault(event.get_source(), []).append(event)
        try:
            batches = await asyncio.wait_for(self._pack(groups, credential), self.timeout)
            if isinstance(batches, Reject):
                return batches
            for packed in batches:
                await asyncio.wait_for(
                    self._client.send_batch(packed, timeout=self.timeout), self.timeout + 1
                )
        except asyncio.CancelledError:
            raise
        except TimeoutError as exc:
            await self._reset_client()
            return Retry(f"no answer from event hub {self.target} within {self.timeout}s: {exc}")
        except Exception as exc:
            return classify(exc, f"sending to event hub {self.target}")
        return Ok()

    async def _pack(
        self, groups: dict[str, list[CloudEvent]], credential: str | None
    ) -> list[EventDataBatch] | Reject:
        """All batches of this attempt, built before sending so a too-big event sends nothing."""
        batches: list[EventDataBatch] = []
        for key, events in groups.items():
            current = await self._client.create_batch(partition_key=key)
            for event in events:
                data = to_event_data(event, self.mode, credential)
                try:
                    current.add(data)
                    continue
                except ValueError as exc:
                    if len(current) == 0:
                        return Reject(
                            f"event {event.get_id()} from {key} is too large for event hub "
                            f"{self.target} (limit {current.max_size_in_bytes} bytes): {exc}"
                        )
                batches.append(current)
                current = await self._client.create_batch(partition_key=key)
                try:
                    current.add(data)
                except ValueError as exc:
                    return Reject(
                        f"event {event.get_id()} from {key} is too large for event hub "
                        f"{self.target} (limit {current.max_size_in_bytes} bytes): {exc}"
                    )
            if len(current):
                batches.append(current)
        return batches

    async def _reset_client(self) -> None:
        """After a timeout the client's state is unknown: drop it, connect afresh next time."""
        old, self._client = self._client, self._make_client()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(old.close(), 1.0)

    async def healthcheck(self) -> Health:
        try:
            props = await asyncio.wait_for(self._client.get_eventhub_properties(), self.timeout + 1)
        except Exception as exc:
            result = classify(exc, f"reading event hub {self.target}")
            reason = result.reason if isinstance(result, Retry | Reject) else str(exc)
            return Health(False, reason)
        return Health(
            True,
            f"event hub {props['eventhub_name']} with {len(props['partition_ids'])} partitions",
        )

    async def _close(self, timeout: float) -> None:
        """Nothing is buffered (sends are awaited), so closing only releases the connection."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._client.close(), timeout)
        if self._credential is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._credential.close(), timeout)

    def __repr__(self) -> str:
        return f"<EventHubsSink {self.name!r} hub={self.target!r} mode={self.mode}>"


def create(config: Config, name: str) -> EventHubsSink:
    return EventHubsSink(name, config)
