"""etcd v3 through its JSON gateway, and the budget's semaphore kept in it.

Why the gateway over our own HTTP client rather than an etcd library: the maintained-looking
Python clients are either gRPC based (`etcd3`, unreleased since 2020 and broken with current
protobuf; `aetcd`, a fork with the same grpcio + protobuf weight, tens of MiB and a slow
import on every VM) or the OpenStack gateway client (`etcd3gw`, synchronous, on `requests`).
Everything the bridge asks of etcd is a unary call the gateway serves as plain JSON POSTs
(`/v3/kv/range`, `/v3/kv/txn`, `/v3/lease/grant|keepalive|revoke`, `/v3/election/*`; a
keep-alive with one message is one request and one answer), so bridge/infra/http1.py, the client
the watchers already use, speaks it with no new dependency: verified TLS, a client
certificate, no proxy, one timeout per call. Waiting for a slot polls a range instead of
holding a watch stream open: a slot frees at most once per maintenance, so a poll a second
costs nothing and needs no streaming.

The gateway's JSON is protobuf's: keys and values are base64, 64-bit integers are strings,
and fields equal to their default (0, false, empty) are left out.

The semaphore, the etcd v3 way: slot `i` of a group is the key
`<prefix>budget/<group>/slot-<i>`, created in a transaction only if it does not exist
(`create_revision == 0`) and attached to this process's lease, with the member's name as
value. At most `budget` such keys can exist, whoever races; a holder that dies stops
renewing its lease and etcd deletes its key when the lease expires. Each change is a new
revision, so etcd's own history shows who held which slot when.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import ssl
from collections.abc import Callable, Sequence
from typing import Any, Final

import certifi

from bridge.actions.coordination.backend import EngineError, Holder, Unavailable
from bridge.actions.coordination.lease_timing import Timing
from bridge.actions.coordination.settings import Coordination
from bridge.infra.buildinfo import user_agent
from bridge.infra.http1 import Http1Client, TransportError, public_cas

log = logging.getLogger("bridge.coordination")

#: gRPC status codes the gateway reports that mean "try again / elsewhere".
_RETRYABLE_CODES: Final = {4, 8, 14}  # deadline exceeded, resource exhausted, unavailable
_UNAUTHENTICATED: Final = 16


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")


def unb64(text: str | None) -> str:
    return base64.b64decode(text or "").decode(errors="replace")


def prefix_end(key: str) -> str:
    """The `range_end` that makes a range cover every key starting with `key`."""
    raw = bytearray(key.encode())
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return base64.b64encode(bytes(raw)).decode("ascii")
        raw.pop()
    return b64("\0")


def tls_context(settings: Coordination) -> ssl.SSLContext | None:
    """The TLS settings of the `https://` endpoints: the CA and the client certificate."""
    if not any(url.startswith("https://") for url in settings.endpoints):
        return None
    if settings.ca_file is None and settings.cert_file is None:
        return public_cas()
    cafile = str(settings.ca_file) if settings.ca_file is not None else certifi.where()
    context = ssl.create_default_context(cafile=cafile)
    if settings.cert_file is not None:
        context.load_cert_chain(
            str(settings.cert_file), str(settings.key_file) if settings.key_file else None
        )
    return context


class EtcdClient:
    """The few etcd v3 calls the bridge makes, over the JSON gateway of `endpoints`.

    Endpoints are tried in order from the last one that answered; a transport error, a
    5xx or a retryable gRPC code moves on to the next, and `Unavailable` is raised only
    when none answered.
    """

    def __init__(self, settings: Coordination) -> None:
        self._settings = settings
        context = tls_context(settings)
        self._clients = [
            Http1Client(
                url,
                timeout=settings.request_timeout,
                user_agent=user_agent(),
                headers={"Content-Type": "application/json"},
                ssl_context=context,
            )
            for url in settings.endpoints
        ]
        self._current = 0
        self._token: str | None = None
        self.endpoint = settings.endpoints[0]

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()

    async def call(
        self, path: str, body: dict[str, Any], *, timeout: float | None = None
    ) -> dict[str, Any]:
        """POST `body` to `/v3/<path>`; the answer's JSON, authenticating when configured."""
        if self._settings.username is not None and self._token is None:
            await self._authenticate()
        try:
            return await self._post(path, body, timeout)
        except _Unauthenticated:
            if self._settings.username is None:
                raise EngineError(
                    "etcd requires authentication: set username and password"
                ) from None
            self._token = None
            await self._authenticate()
            try:
                return await self._post(path, body, timeout)
            except _Unauthenticated as exc:
                raise EngineError(f"etcd refused the credentials: {exc}") from None

    async def _authenticate(self) -> None:
        password = self._settings.password
        assert self._settings.username is not None
        assert password is not None
        body = {"name": self._settings.username, "password": password.get_secret_value()}
        try:
            answer = await self._post("auth/authenticate", body, None, authenticated=False)
        except (_Unauthenticated, EngineError) as exc:
            raise EngineError(f"etcd refused the credentials of {body['name']}: {exc}") from None
        self._token = str(answer.get("token", ""))

    async def _post(
        self,
        path: str,
        body: dict[str, Any],
        timeout: float | None,
        *,
        authenticated: bool = True,
    ) -> dict[str, Any]:
        payload = json.dumps(body).encode()
        headers = {"Authorization": self._token} if authenticated and self._token else {}
        errors: list[str] = []
        count = len(self._clients)
        for step in range(count):
            index = (self._current + step) % count
            client = self._clients[index]
            url = self._settings.endpoints[index]
            try:
                response = await client.request(
                    "POST", f"v3/{path}", headers=headers, body=payload, timeout=timeout
                )
            except TransportError as exc:
                errors.append(f"{url}: {exc}")
                continue
            try:
                answer = response.json()
            except ValueError:
                answer = {}
            if not isinstance(answer, dict):
                answer = {}
            code = answer.get("code")
            message = str(answer.get("message") or answer.get("error") or response.text[:200])
            if response.status >= 500 or code in _RETRYABLE_CODES:
                if code == _UNAUTHENTICATED:
                    raise _Unauthenticated(message)
                errors.append(f"{url}: HTTP {response.status} {message}")
                continue
            if code == _UNAUTHENTICATED or response.status == 401:
                raise _Unauthenticated(message)
            if response.status != 200:
                raise EngineError(f"{path}: HTTP {response.status} {message}")
            self._current = index
            self.endpoint = url
            return answer
        raise Unavailable("; ".join(errors))

    # -- the calls ------------------------------------------------------------------------------

    async def range(
        self, key: str, *, prefix: bool = False, revision: int = 0
    ) -> tuple[list[dict[str, Any]], int]:
        """The key-values of `key` (or every key under it), and the store's revision."""
        body: dict[str, Any] = {"key": b64(key)}
        if prefix:
            body["range_end"] = prefix_end(key)
        if revision:
            body["revision"] = str(revision)
        answer = await self.call("kv/range", body)
        return list(answer.get("kvs") or ()), int(answer["header"]["revision"])

    async def txn(
        self, compare: Sequence[dict[str, Any]], success: Sequence[dict[str, Any]]
    ) -> bool:
        """A transaction with no failure branch: whether `compare` held (and `success` ran)."""
        answer = await self.call("kv/txn", {"compare": list(compare), "success": list(success)})
        return bool(answer.get("succeeded"))

    async def grant(self, ttl: int) -> int:
        answer = await self.call("lease/grant", {"TTL": str(ttl)})
        return int(answer["ID"])

    async def keepalive(self, lease: int, *, timeout: float | None = None) -> int:
        """Renew `lease`; its new time to live, 0 when it no longer exists."""
        answer = await self.call("lease/keepalive", {"ID": str(lease)}, timeout=timeout)
        return int((answer.get("result") or {}).get("TTL") or 0)

    async def revoke(self, lease: int, *, timeout: float | None = None) -> None:
        with contextlib.suppress(EngineError):  # already gone: what revoking wanted
            await self.call("lease/revoke", {"ID": str(lease)}, timeout=timeout)

    async def version(self) -> str:
        """The server's version, from its `/version` document (a GET, outside `/v3`)."""
        errors = []
        for url, client in zip(self._settings.endpoints, self._clients, strict=True):
            try:
                response = await client.request("GET", "version")
            except TransportError as exc:
                errors.append(f"{url}: {exc}")
                continue
            try:
                return f"etcd {response.json()['etcdserver']} at {url}"
            except (ValueError, KeyError, TypeError):
                return f"HTTP {response.status} at {url} (not an etcd /version answer)"
        raise Unavailable("; ".join(errors))


class _Unauthenticated(Exception):
    pass


def slot_prefix(settings: Coordination, group: str) -> str:
    return f"{settings.prefix}budget/{group}/"


class EtcdBackend:
    """The budget's semaphore in etcd (see the module docstring), on one lease per process.

    The lease is granted with the first slot, renewed every `lease_ttl / 3` seconds while a
    slot is held and revoked when the last one is released. Renewals follow `Timing`: when
    none succeeded by the local deadline, `on_unrenewed` is called for every held slot
    (another member may take it from when the lease can expire), and renewals go on. If
    etcd reports the lease gone (it expired while etcd was unreachable), the slots still
    wanted are taken again.
    """

    def __init__(self, settings: Coordination, client: EtcdClient | None = None) -> None:
        self._settings = settings
        self.client = client or EtcdClient(settings)
        self._lease: int | None = None
        self._held: dict[str, str] = {}  # group -> member
        self._lock = asyncio.Lock()
        self._renewer: asyncio.Task[None] | None = None
        self._lost = 0
        self.renew_failures = 0
        #: How many times the local deadline passed without a renewal (see `Timing`).
        self.unrenewed = 0
        #: Loop time the last successful renewal (or the grant) was sent.
        self._renewed_sent = 0.0
        #: Called with (group, why) for each slot held when the local deadline passes.
        self.on_unrenewed: Callable[[str, str], None] = lambda _group, _why: None

    @property
    def lost(self) -> int:
        return self._lost

    async def _ensure_lease(self) -> int:
        if self._lease is None:
            sent = asyncio.get_running_loop().time()
            self._lease = await self.client.grant(self._settings.lease_ttl)
            self._renewed_sent = sent
            log.debug("granted lease %x (ttl %ds)", self._lease, self._settings.lease_ttl)
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew(), name="coordination:lease")
        return self._lease

    async def acquire(self, group: str, member: str, budget: int) -> Holder | None:
        async with self._lock:
            holder = await self._acquire(group, member, budget)
            if holder is not None:
                self._held[group] = member
            return holder

    async def _acquire(self, group: str, member: str, budget: int) -> Holder | None:
        base = slot_prefix(self._settings, group)
        kvs, _ = await self.client.range(base, prefix=True)
        taken = {unb64(kv["key"]): kv for kv in kvs}
        mine = {key: kv for key, kv in taken.items() if unb64(kv.get("value")) == member}
        if not mine and len(taken) >= budget:
            return None  # no lease is granted while waiting: only a holder needs one
        lease = await self._ensure_lease()
        for key, kv in mine.items():
            if int(kv.get("lease") or 0) == lease:
                return Holder(key, member, int(kv["mod_revision"]))
            # An earlier life of this process (its lease not expired yet): take it over.
            took = await self.client.txn(
                [_compare_mod(key, int(kv["mod_revision"]))], [_put(key, member, lease)]
            )
            if took:
                return await self._holder(key, member)
        if len(taken) >= budget:
            return None
        for index in range(budget):
            key = f"{base}slot-{index}"
            if key in taken:
                continue
            if await self.client.txn([_absent(key)], [_put(key, member, lease)]):
                return await self._holder(key, member)
        return None

    async def _holder(self, key: str, member: str) -> Holder:
        kvs, revision = await self.client.range(key)
        since = int(kvs[0]["mod_revision"]) if kvs else revision
        return Holder(key, member, since)

    async def release(self, group: str, member: str) -> None:
        async with self._lock:
            base = slot_prefix(self._settings, group)
            kvs, _ = await self.client.range(base, prefix=True)
            for kv in kvs:
                if unb64(kv.get("value")) == member:
                    key = unb64(kv["key"])
                    await self.client.txn([_compare_value(key, member)], [_delete(key)])
            self._held.pop(group, None)
            if not self._held and self._lease is not None:
                lease, self._lease = self._lease, None
                if self._renewer is not None:
                    self._renewer.cancel()
                    self._renewer = None
                await self.client.revoke(lease)

    async def holders(self, group: str) -> list[Holder]:
        kvs, _ = await self.client.range(slot_prefix(self._settings, group), prefix=True)
        return [
            Holder(unb64(kv["key"]), unb64(kv.get("value")), int(kv["mod_revision"])) for kv in kvs
        ]

    async def describe(self) -> str:
        """The server's version, and a read of the prefix: proves the credentials and the
        permissions too, not only that something answers."""
        version = await self.client.version()
        prefix = self._settings.prefix
        body = {"key": b64(prefix), "range_end": prefix_end(prefix), "count_only": True}
        answer = await self.client.call("kv/range", body)
        return f"{version}, {int(answer.get('count') or 0)} key(s) under {prefix}"

    async def _renew(self) -> None:
        """Keep the lease alive by `Timing`'s rules; report the held slots when the local
        deadline passes without a renewal; take the slots again if the lease expired."""
        loop = asyncio.get_running_loop()
        timing = Timing(float(self._settings.lease_ttl), self._settings.request_timeout)
        due = self._renewed_sent + timing.renew_every
        reported = False
        while True:
            deadline = timing.deadline(self._renewed_sent)
            await asyncio.sleep(max(0.0, (due if reported else min(due, deadline)) - loop.time()))
            lease = self._lease
            if lease is None:
                return
            now = loop.time()
            if now >= deadline and not reported:
                reported = True
                self.unrenewed += 1
                why = f"not renewed within {deadline - self._renewed_sent:g}s"
                for group in list(self._held):
                    self.on_unrenewed(group, why)
            limit = timing.request_timeout
            if not reported:
                limit = min(limit, deadline - now)
            try:
                async with asyncio.timeout(limit):
                    ttl = await self.client.keepalive(lease, timeout=limit)
            except (Unavailable, EngineError, TimeoutError) as exc:
                self.renew_failures += 1
                log.warning(
                    "cannot renew the coordination lease (slots count as lost in %.1fs): %s",
                    max(0.0, deadline - loop.time()),
                    exc or "no answer",
                )
                due = loop.time() + timing.retry_pause
                continue
            if ttl > 0:
                if reported:
                    log.warning("the coordination lease is renewed again: no slot was lost")
                    reported = False
                self._renewed_sent = now
                due = now + timing.renew_every
                continue
            log.warning("the coordination lease expired: taking the held slot(s) again")
            async with self._lock:
                if self._lease == lease:
                    self._lease = None
                for group, member in list(self._held.items()):
                    try:
                        holder = await self._acquire(group, member, self._settings.budget)
                    except (Unavailable, EngineError) as exc:
                        log.warning("cannot take the slot of %s again yet: %s", group, exc)
                        holder = None
                    if holder is None:
                        self._lost += 1
                        log.warning("slot of %s lost: others hold the whole budget", group)
            # On the new lease, if a slot was taken again (this task renews it); else none.
            reported = False
            due = self._renewed_sent + timing.renew_every

    async def aclose(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        await self.client.aclose()


def _absent(key: str) -> dict[str, Any]:
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def _compare_mod(key: str, revision: int) -> dict[str, Any]:
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def _compare_value(key: str, value: str) -> dict[str, Any]:
    return {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value)}


def _put(key: str, value: str, lease: int) -> dict[str, Any]:
    return {"request_put": {"key": b64(key), "value": b64(value), "lease": str(lease)}}


def _delete(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(key)}}
