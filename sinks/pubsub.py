"""Publishes events to a Google Cloud Pub/Sub topic, per the CloudEvents Pub/Sub binding.

Two content modes, as Google's binding defines them:

* ``binary`` (default): the message data is the event's JSON ``data``; every context attribute
  travels as a message attribute ``ce-<name>`` and ``datacontenttype`` as ``content-type``.
  Subscribers can filter on attributes without parsing the payload.
* ``structured``: the message data is the whole event as JSON and the only attribute is
  ``content-type: application/cloudevents+json; charset=UTF-8``.

Pub/Sub limits attributes (keys <= 256 bytes, values <= 1024 bytes, at most 100 per message).
An event that cannot fit in binary mode is sent in *structured* mode instead of being
rejected: the binding lets a consumer tell the modes apart by ``content-type``, and a
dead-lettered maintenance notice helps nobody. Our own events never come close; only an
unusual extension attribute could.

Instance identity: with `[identity]` configured, every message carries the sidecar's
credential as the attribute ``bridgecredential`` (both modes; `bridge.transports.pubsub`),
which the fleet's `pubsub` source screens. A bus cannot answer 401, so the sink never learns
of a refusal: the credential is renewed before it expires, not on a refusal.

Ordering: with ``ordering`` on, the ordering key is the event ``source`` (one VM), so each
VM's notices arrive in order while VMs do not hold each other up. The client library pauses
a key after any failed publish; we call ``resume_publish`` before returning ``Retry``, or the
key would refuse every later message.

Retries belong to the dispatcher. With ordering enabled the client library would retry a
failed publish *forever* (it forces an infinite deadline onto any retry policy it is given),
hiding an outage from us and from the spool, so every publish is made with ``retry=None``
and a gRPC deadline of ``timeout``: one attempt, whose outcome the dispatcher sees.

``google.cloud.pubsub_v1`` is imported only when a sink is built (it costs ~0.3 s and ~60 MB),
so a bridge that does not use Pub/Sub never loads it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import msgspec
from cloudevents.core.v1.event import CloudEvent

from bridge.sinkapi import (
    CredentialSource,
    FieldError,
    Health,
    Ok,
    Reject,
    Result,
    Retry,
    Sink,
    SinkConfig,
    instance_credential,
    serialize,
)
from bridge.transports.pubsub import (
    PUBSUB_SCOPE,
    STRUCTURED_CONTENT_TYPE,
    binary_attributes,
    fits_attribute_limits,
    with_credential,
)

if TYPE_CHECKING:
    from google.cloud.pubsub_v1 import PublisherClient  # type: ignore[import-untyped]

log = logging.getLogger("sinks.pubsub")

PUBLISHER_ROLE: Final = "roles/pubsub.publisher"

# Project ids: 6-30 chars (optionally domain-scoped, "example.com:proj"); topic names:
# 3-255 chars from a restricted set, starting with a letter and not with "goog".
_TOPIC_RE: Final = re.compile(
    r"^projects/(?P<project>(?:[a-z][a-z0-9.-]*:)?[a-z][a-z0-9-]{4,28}[a-z0-9])"
    r"/topics/(?P<topic>(?!goog)[A-Za-z][A-Za-z0-9\-_.~+%]{2,254})$"
)


class Config(SinkConfig, frozen=True, kw_only=True):
    type: Literal["pubsub"] = "pubsub"
    #: Full topic path, ``projects/<project>/topics/<topic>``.
    topic: str
    mode: Literal["binary", "structured"] = "binary"
    #: Service-account key file; unset means Application Default Credentials.
    credentials_file: Path | None = None
    #: Ordering key = event source (per-VM order); the subscription must enable ordering too.
    ordering: bool = True
    #: Override the API endpoint (``host:port``), e.g. a regional or private endpoint.
    endpoint: str | None = None
    #: Deadline of one publish attempt, in seconds.
    timeout: Annotated[float, msgspec.Meta(gt=0)] = 30.0

    def __post_init__(self) -> None:
        if not _TOPIC_RE.match(self.topic):
            raise FieldError(
                "topic",
                f"must look like projects/<project-id>/topics/<topic-name>, got {self.topic!r}",
            )


def encode(
    event: CloudEvent, mode: str, credential: str | None = None
) -> tuple[bytes, dict[str, str]]:
    """The message (data, attributes) for `event`, carrying the sidecar's `credential` when
    it has one; binary falls back to structured if needed."""
    if mode == "binary":
        data, event_attributes = binary_attributes(event)
        attributes = with_credential(event_attributes, credential)
        problem = fits_attribute_limits(attributes)
        if problem is None:
            return data, attributes
        log.warning(
            "event %s does not fit Pub/Sub attribute limits (%s); sending it in structured mode",
            event.get_id(),
            problem,
        )
    return serialize(event), with_credential({"content-type": STRUCTURED_CONTENT_TYPE}, credential)


def classify(exc: BaseException, topic: str) -> Result:
    """Map a publish failure to Retry or Reject (unknown failures are retried: nothing lost)."""
    from google.api_core import exceptions as gexc
    from google.cloud.pubsub_v1.publisher import exceptions as pexc  # type: ignore[import-untyped]

    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, gexc.NotFound):
        return Reject(f"Pub/Sub topic {topic} does not exist (create it or fix `topic`): {detail}")
    if isinstance(exc, gexc.PermissionDenied | gexc.Unauthenticated):
        return Reject(
            f"permission denied publishing to {topic}: grant {PUBLISHER_ROLE} on the topic to "
            f"the sink's service account (on GCE the VM's access scopes must include "
            f"{PUBSUB_SCOPE} or cloud-platform): {detail}"
        )
    if isinstance(exc, gexc.InvalidArgument | pexc.MessageTooLargeError):
        return Reject(f"Pub/Sub refused the message for {topic} as invalid: {detail}")
    if isinstance(exc, gexc.DeadlineExceeded | TimeoutError | concurrent.futures.TimeoutError):
        return Retry(f"publish to {topic} timed out: {detail}")
    # ServiceUnavailable, InternalServerError, Aborted, ResourceExhausted, auth transport
    # errors, batches cancelled after an earlier failure on the same key, and anything else.
    return Retry(f"publish to {topic} failed: {detail}")


class PubSubSink(Sink):
    max_batch = 100
    #: The sidecar's credential (`[identity]`), set by the runner; None: none is sent.
    enrollment: CredentialSource | None = None

    def __init__(self, name: str, config: Config) -> None:
        super().__init__(name)
        self.topic = config.topic
        self.mode = config.mode
        self.ordering = config.ordering
        self.timeout = config.timeout
        self._credentials_file = config.credentials_file
        self._endpoint = config.endpoint
        self._client: PublisherClient | None = None
        self._client_lock = asyncio.Lock()
        self._outstanding: set[concurrent.futures.Future[Any]] = set()
        self._outstanding_lock = threading.Lock()

    def _build_client(self) -> PublisherClient:
        """Create the publisher (blocking: ADC may ask the metadata server)."""
        from google.cloud import pubsub_v1  # type: ignore[import-untyped]

        kwargs: dict[str, Any] = {}
        if self._credentials_file is not None:
            from google.oauth2 import service_account

            kwargs["credentials"] = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                str(self._credentials_file), scopes=[PUBSUB_SCOPE]
            )
        if self._endpoint:
            kwargs["client_options"] = {"api_endpoint": self._endpoint}
        return pubsub_v1.PublisherClient(
            publisher_options=pubsub_v1.types.PublisherOptions(
                enable_message_ordering=self.ordering
            ),
            **kwargs,
        )

    async def _get_client(self) -> PublisherClient:
        """The publisher, created on first use off the event loop.

        Raises `_NoClientError` carrying the outcome when it cannot be created: a broken key
        file is a configuration error (Reject); missing Application Default Credentials are
        retried, because on GCE they come from the metadata server, which can hiccup.
        """
        async with self._client_lock:
            if self._client is None:
                try:
                    self._client = await asyncio.to_thread(self._build_client)
                except (OSError, ValueError) as exc:
                    raise _NoClientError(
                        Reject(
                            f"cannot load Pub/Sub credentials from {self._credentials_file}: {exc}"
                        )
                    ) from exc
                except Exception as exc:
                    raise _NoClientError(
                        Retry(f"cannot create the Pub/Sub client: {type(exc).__name__}: {exc}")
                    ) from exc
            return self._client

    def _track(self, future: concurrent.futures.Future[Any]) -> None:
        with self._outstanding_lock:
            self._outstanding.add(future)

        def done(f: concurrent.futures.Future[Any]) -> None:
            with self._outstanding_lock:
                self._outstanding.discard(f)

        future.add_done_callback(done)

    def _submit(
        self, client: PublisherClient, batch: Sequence[CloudEvent], credential: str | None
    ) -> list[tuple[str, concurrent.futures.Future[Any]]]:
        """Hand every event to the client (non-blocking batching); one future per event."""
        from google.cloud.pubsub_v1.publisher import exceptions as pexc

        submitted = []
        for event in batch:
            data, attributes = encode(event, self.mode, credential)
            key = event.get_source() if self.ordering else ""
            future: concurrent.futures.Future[Any]
            try:
                future = client.publish(
                    self.topic,
                    data,
                    ordering_key=key,
                    retry=None,
                    timeout=self.timeout,
                    **attributes,
                )
            except pexc.MessageTooLargeError as exc:
                future = concurrent.futures.Future()
                future.set_exception(exc)
            self._track(future)
            submitted.append((key, future))
        return submitted

    async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
        from google.cloud.pubsub_v1.publisher import exceptions as pexc

        credential = await instance_credential(self.enrollment)
        if isinstance(credential, Retry):
            return credential
        try:
            client = await self._get_client()
        except _NoClientError as exc:
            return exc.result
        self._resume(client, {e.get_source() for e in batch})
        submitted = self._submit(client, batch, credential)
        wrapped = [asyncio.wrap_future(f) for _, f in submitted]
        # The RPC deadline is `timeout`; allow a little for batching and thread hand-offs.
        _, pending = await asyncio.wait(wrapped, timeout=self.timeout + 2.0)
        failed_keys: set[str] = set()
        first: Result | None = None
        for (key, _), waiter in zip(submitted, wrapped, strict=True):
            if waiter in pending:
                waiter.cancel()  # only our asyncio wrapper; the client's future lives on
                failed_keys.add(key)
                first = first or Retry(f"publish to {self.topic} timed out after {self.timeout}s")
                continue
            error = waiter.exception()
            if error is None:
                continue
            failed_keys.add(key)
            if isinstance(error, pexc.PublishToPausedOrderingKeyException | RuntimeError):
                outcome: Result = Retry(f"publish to {self.topic} failed: {error}")
            else:
                outcome = classify(error, self.topic)
            # Report the worst outcome: a Reject tells the dispatcher to isolate the bad event.
            if first is None or (isinstance(outcome, Reject) and not isinstance(first, Reject)):
                first = outcome
        self._resume(client, failed_keys)
        return first or Ok()

    def _resume(self, client: PublisherClient, keys: set[str]) -> None:
        """Unpause ordering keys after a failure; harmless for keys that are not paused."""
        if not self.ordering:
            return
        for key in keys:
            # RuntimeError: "Ordering key is not paused." (e.g. a timed-out batch in flight)
            with contextlib.suppress(RuntimeError):
                client.resume_publish(self.topic, key)

    async def flush(self, timeout: float) -> None:
        """Wait, within `timeout`, for messages a timed-out or cancelled publish left behind."""
        with self._outstanding_lock:
            pending = list(self._outstanding)
        if pending:
            await asyncio.to_thread(concurrent.futures.wait, pending, timeout)

    async def healthcheck(self) -> Health:
        """Whether the topic exists and we may publish to it.

        ``get_topic`` needs ``pubsub.topics.get``, which ``roles/pubsub.publisher`` lacks; on
        a permission error we ask ``testIamPermissions`` whether publishing is allowed.
        """
        from google.api_core import exceptions as gexc

        try:
            client = await self._get_client()
        except _NoClientError as exc:
            return Health(False, exc.result.reason)

        def check() -> Health:
            try:
                client.get_topic(topic=self.topic, retry=None, timeout=min(self.timeout, 10.0))
            except gexc.NotFound:
                return Health(False, f"Pub/Sub topic {self.topic} does not exist")
            except gexc.PermissionDenied as exc:
                try:
                    answer = client.test_iam_permissions(
                        request={"resource": self.topic, "permissions": ["pubsub.topics.publish"]},
                        retry=None,
                        timeout=min(self.timeout, 10.0),
                    )
                except gexc.GoogleAPIError:
                    answer = None
                if answer is not None and "pubsub.topics.publish" in answer.permissions:
                    return Health(
                        True,
                        f"may publish to {self.topic} (existence not checked: "
                        f"no pubsub.topics.get permission)",
                    )
                return Health(
                    False,
                    f"permission denied on {self.topic}: grant {PUBLISHER_ROLE} on the topic "
                    f"to the service account (and on GCE the {PUBSUB_SCOPE} or cloud-platform "
                    f"access scope): {exc.message}",
                )
            except gexc.GoogleAPIError as exc:
                return Health(False, f"cannot check {self.topic}: {type(exc).__name__}: {exc}")
            except Exception as exc:
                return Health(False, f"cannot check {self.topic}: {type(exc).__name__}: {exc}")
            return Health(True, f"Pub/Sub topic {self.topic} exists")

        return await asyncio.to_thread(check)

    async def _close(self, timeout: float) -> None:
        """Wait for outstanding messages within `timeout`, then stop the client's threads.

        ``stop()`` does not wait for in-flight batches (its threads are daemons), so the
        waiting happens here or the last messages of a shutdown would be lost.
        """
        if self._client is None:
            return
        await self.flush(timeout)
        client, self._client = self._client, None
        await asyncio.to_thread(client.stop)

    def __repr__(self) -> str:
        return f"<PubSubSink {self.name!r} topic={self.topic} mode={self.mode}>"


class _NoClientError(Exception):
    def __init__(self, result: Retry | Reject) -> None:
        super().__init__(result.reason)
        self.result = result


def create(config: Config, name: str) -> PubSubSink:
    return PubSubSink(name, config)
