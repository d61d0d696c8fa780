"""The configuration of the bus sources: `[[fleet.sources]]` of `type = "pubsub"` and
`type = "eventhubs"` (registered in `bridge.fleet.config.SOURCE_TYPES`).

```toml
[[fleet.sources]]
type = "pubsub"
subscription = "projects/my-project/subscriptions/maintenance-fleet"

[[fleet.sources]]
type = "eventhubs"
connection_string = "env:FLEET_EVENTHUBS_CONNECTION_STRING"
consumer_group = "fleet"
```

Plain Structs, no SDK: the sources' modules (`bridge.fleet.sources.pubsub`,
`bridge.fleet.sources.eventhubs`) import google-cloud-pubsub or azure-eventhub only when the
service builds a configured source.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Final, Literal

import msgspec

from bridge.fleet.identity.config import IdentityMode
from bridge.infra.secrets import Secret
from bridge.infra.validation import FieldError
from bridge.transports.eventhubs import check_target

_SUBSCRIPTION: Final = re.compile(r"^projects/[^/\s]+/subscriptions/[^/\s]+$")


class _BusSource(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """What every bus source takes: how many messages one store transaction commits, at
    most, and how long a partial batch waits for more (throughput against latency), and
    the backoff while the store cannot commit (nothing is acknowledged meanwhile), and the
    instance identity asked of each message (its `bridgecredential` attribute), as the http
    source asks it of each request."""

    batch_size: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 500
    batch_wait: Annotated[float, msgspec.Meta(ge=0, le=60)] = 0.05
    retry_initial: Annotated[float, msgspec.Meta(gt=0)] = 0.5
    retry_max: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    #: Instance identity (`[fleet.identity]`, bridge/fleet/identity/): only messages of
    #: enrolled sidecars about their own VM ("required"), or marked when they are ("optional").
    identity: IdentityMode = "off"


class PubsubSourceConfig(_BusSource, frozen=True, kw_only=True):
    """`type = "pubsub"`: a streaming pull on one subscription (bridge/fleet/sources/pubsub.py).

    The subscription is made by the operator on the topic the sidecars' Pub/Sub sink
    publishes to; both content modes of that sink are read. Credentials: a service-account
    key file, or Application Default Credentials; `PUBSUB_EMULATOR_HOST` is honoured.
    """

    type: Literal["pubsub"] = "pubsub"
    name: str = "pubsub"
    #: `projects/<project>/subscriptions/<subscription>`.
    subscription: str
    credentials_file: Path | None = None
    #: Override the API endpoint (`host:port`).
    endpoint: str | None = None
    #: Messages pulled and not yet acknowledged, at most (what the source holds).
    max_outstanding: Annotated[int, msgspec.Meta(ge=1)] = 2000
    #: Seconds each lease extension lasts (Pub/Sub's minimum is 10): what a replica that
    #: died holds comes back to the others this long after, at most.
    lease_extension: Annotated[int, msgspec.Meta(ge=10, le=600)] = 10

    def __post_init__(self) -> None:
        if not _SUBSCRIPTION.match(self.subscription):
            raise FieldError(
                "subscription",
                "must look like projects/<project-id>/subscriptions/<name>, "
                f"got {self.subscription!r}",
            )


class EventHubsSourceConfig(_BusSource, frozen=True, kw_only=True):
    """`type = "eventhubs"`: one consumer group over every partition of a hub
    (bridge/fleet/sources/eventhubs.py); checkpoints live in the fleet store.

    A connection string (a Secret: literal, `env:VAR` or `file:PATH`), or a namespace and a
    hub with Azure AD (DefaultAzureCredential: managed identity, workload identity...).
    """

    type: Literal["eventhubs"] = "eventhubs"
    name: str = "eventhubs"
    connection_string: Secret | None = None
    fully_qualified_namespace: str | None = None
    eventhub: str | None = None
    consumer_group: str = "$Default"
    #: Where a partition without a checkpoint starts: its oldest retained event, or new ones.
    start: Literal["earliest", "latest"] = "earliest"
    transport: Literal["amqp", "websockets"] = "amqp"
    #: Replicas split the partitions, their ownership kept in the fleet store
    #: (bridge/fleet/sources/eventhubs_ownership.py); off: each replica reads them all.
    share_partitions: bool = False
    #: Seconds between two looks at who owns what; an owner silent for 6 of them loses all.
    load_balancing_interval: Annotated[float, msgspec.Meta(gt=0, le=300)] = 10.0

    def __post_init__(self) -> None:
        check_target(self.connection_string, self.fully_qualified_namespace, self.eventhub)
