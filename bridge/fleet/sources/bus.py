"""What the bus sources (Pub/Sub, Event Hubs, and Kafka later) share: turning a batch of
received messages into one store commit, and holding on until that commit succeeds.

A bus redelivers whatever was not acknowledged, so a source that cannot commit must keep its
messages unacknowledged and try again, never drop them and never acknowledge early. A
message that is not a valid event is no reason to stall: it is refused (recorded in the
rejected table with its reason, in the same transaction) and acknowledged with the rest.

Instance identity (`identity = "required" | "optional"`, bridge/fleet/identity/): each
message's `bridgecredential` attribute is screened by the same code as the http source's
header (`bridge.fleet.identity.screen`). A bus cannot answer 401 or 403, so a refused
message is what a poison message is: kept in the rejected table with the reason
(`identity: ...`), counted (`fleet_identity_events_total`), and acknowledged. A message
may wait on the bus (the fleet down): its credential is checked at the time the bus took
it, where the bus stamps that itself (Pub/Sub's publish time, Event Hubs' enqueued time,
Kafka's log-append time), else now.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TypeVar

from tenacity import AsyncRetrying, retry_if_exception_type

from bridge.fleet import ingest_log
from bridge.fleet.bus_config import _BusSource
from bridge.fleet.identity.gate import IdentityGate
from bridge.fleet.identity.screen import screen
from bridge.fleet.sources.base import Ingestor, classify
from bridge.fleet.sources.converting import converted
from bridge.fleet.store import Accepted, IngestResult, Refused, StoreError
from bridge.infra.backoff import Backoff

log = logging.getLogger("bridge.fleet.bus")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Decoded:
    """One message as the structured JSON of its event, or why it cannot be one, and the
    instance credential it carries (None without one) and when the bus took it (Unix
    seconds, stamped by the bus itself; None when it cannot vouch for a time).

    `checked`: the body as the contract and the fleet's bounds found it (`check`), done
    where the message is decoded (a pull's thread, a partition's hand-over, the Kafka
    consumer's thread), so that it runs while the previous batch is being written (the
    stores write on a thread of their own, their C code without the GIL); None: not yet,
    the committer checks it."""

    body: bytes | None
    refused: Refused | None = None
    credential: str | None = None
    sent_at: float | None = None
    checked: Accepted | Refused | None = None


def check(body: bytes) -> Accepted | Refused:
    """`body` as a valid event, or refused with the reason (`classify`, for one body)."""
    accepted, refused = classify((body,))
    return accepted[0] if accepted else refused[0][1]


def decode(
    raw: bytes,
    convert: Callable[[], bytes],
    credential: str | None = None,
    sent_at: datetime | None = None,
) -> Decoded:
    """`convert()`: the message's event as structured JSON, checked (`check`), or `raw`
    refused with the reason (`converted`)."""
    at = sent_at.timestamp() if sent_at is not None else None
    body = converted(convert)
    if isinstance(body, str):
        return Decoded(None, Refused(raw, body))
    return Decoded(body, None, credential, at, check(body))


class Committer:
    """Commits batches for one bus source, retrying (with `bridge.infra.backoff`) while the store
    fails; the caller acknowledges its messages after `commit` returned."""

    def __init__(
        self,
        name: str,
        ingestor: Ingestor,
        config: _BusSource,
        identity: IdentityGate | None = None,
    ) -> None:
        self.name = name
        self.ingestor = ingestor
        self.identity = identity
        self._backoff = Backoff(config.retry_initial, config.retry_max, lambda _state: None)
        #: The store's last error while it keeps failing (health), None once it commits.
        self.failing: str | None = None
        self.committed = 0

    async def commit(
        self, messages: Sequence[Decoded], checkpoints: Mapping[str, str] | None = None
    ) -> IngestResult:
        """Commit `messages` (and the positions they reach) in one transaction; retries
        until it succeeds, so only cancellation (the source stopping) ends it otherwise."""
        accepted, refused = self._screened(messages)
        retrying = AsyncRetrying(
            wait=self._backoff,
            retry=retry_if_exception_type(StoreError),
            before_sleep=self._note,
            reraise=True,
        )
        result: IngestResult | None = None
        async for attempt in retrying:
            with attempt:
                result = await self.ingestor.commit(self.name, accepted, refused, checkpoints)
        assert result is not None
        ingest_log.refused_messages(self.name, refused)  # found again from the sidecar's log
        if self.failing is not None:
            log.info("source %s: the fleet store commits again", self.name)
        self.failing = None
        self.committed += len(messages)
        return result

    def _screened(self, messages: Sequence[Decoded]) -> tuple[list[Accepted], list[Refused]]:
        """The valid events of `messages` the identity gate lets through, in their order, and
        the refused ones (not events, invalid, or refused by the gate, with the reasons).
        Each message is screened alone against the credential it carries: on a bus every
        message is its own request (the credential check is cached, so this is one lookup).
        Without an identity gate there is nothing to screen per message: the whole batch is
        classified at once."""
        if self.identity is None or self.identity.mode == "off":
            refused = [m.refused for m in messages if m.body is None and m.refused is not None]
            checked = [_checked(m.checked, m.body) for m in messages if m.body is not None]
            valid = [c for c in checked if isinstance(c, Accepted)]
            refused.extend(c for c in checked if isinstance(c, Refused))
            return valid, refused
        accepted: list[Accepted] = []
        refused = []
        for message in messages:
            if message.body is None:
                if message.refused is not None:
                    refused.append(message.refused)
                continue
            found = _checked(message.checked, message.body)
            valid, invalid = ([found], []) if isinstance(found, Accepted) else ([], [(0, found)])
            gated = screen(self.identity, message.credential, valid, invalid, message.sent_at)
            accepted.extend(replace(a, attested=gated.attested) for a in gated.accepted)
            refused.extend(r for _, r in gated.refused)
        return accepted, refused

    def _note(self, state: object) -> None:
        outcome = getattr(state, "outcome", None)
        error = outcome.exception() if outcome is not None else None
        if self.failing is None:
            log.warning(
                "source %s: cannot commit, holding the batch (unacknowledged) and retrying: %s",
                self.name,
                error,
            )
        self.failing = str(error)


def _checked(checked: Accepted | Refused | None, body: bytes) -> Accepted | Refused:
    return checked if checked is not None else check(body)


async def next_batch(queue: asyncio.Queue[T], size: int, wait: float) -> list[T]:
    """The next item of `queue` (waiting for it) and whatever else comes within `wait`
    seconds, `size` items at most."""
    batch = [await queue.get()]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while len(batch) < size:
        if not queue.empty():
            batch.append(queue.get_nowait())
            continue
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            batch.append(await asyncio.wait_for(queue.get(), remaining))
        except TimeoutError:
            break
    return batch
