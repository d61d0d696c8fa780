"""Request signatures of the webhook sink: Standard Webhooks and GitHub-style HMAC, made by
the sink and verified by the fleet's `http` source.

Kept apart from both so the exact byte layout that receivers verify is in one small, pure
module. Both schemes sign the *exact* body bytes that go on the wire: the caller
serializes once and hands the same `bytes` object to the signer and to the HTTP client, so a
re-serialization (key order, whitespace) can never make a valid event fail verification.

Binary mode carries the event's attributes in `ce-*` headers, outside the body, so a
signature over the body alone lets a captured request be replayed with another `ce-source`
or `ce-id`. There the Standard Webhooks header also carries `v1ce,` signatures: the same
HMAC-SHA256, over `id.timestamp.` + `attributes_block(headers)` + the body, where the block
names every `ce-*` header and `content-type` (lowercased names, sorted, `name:value` and a
line feed each, then an empty line). The plain `v1,` signature is still sent, so receivers
that only know Standard Webhooks keep verifying the body (docs/security.md says why the fleet
service takes only `v1ce` in binary mode).

A receiver checks from the headers first (`verification`: present, well formed, recent, a
signature of a version it takes) and refuses at once what cannot verify, then feeds the body
into the returned `Verification` as it streams in and asks `verified()` at its end.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

#: Prefix of Standard Webhooks secrets; the rest is base64 of the HMAC key.
SECRET_PREFIX: Final = "whsec_"  # noqa: S105 (a prefix, not a secret)
GITHUB_HEADER: Final = "X-Hub-Signature-256"
#: The signature label over the body only, and over the ce-* attributes and the body.
BODY_VERSION: Final = "v1"
ATTRIBUTES_VERSION: Final = "v1ce"

# Fixed forever: the webhook-id of a multi-event batch is derived from its event ids, so a
# retried batch keeps its id. Changing this would change ids receivers may have stored.
_BATCH_NAMESPACE: Final = uuid.UUID("0b6f7c1e-3d7a-4f0e-9a51-2c4e8d9b1f63")


def standard_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (`whsec_` + base64, prefix optional).

    Decoded strictly so that a secret pasted with a typo is a configuration error at start,
    not a stream of signatures no receiver accepts. The message never echoes the secret.
    """
    text = secret.removeprefix(SECRET_PREFIX).strip()
    padded = text + "=" * (-len(text) % 4)
    try:
        key = base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(
            "is not a Standard Webhooks secret: expected whsec_ followed by base64"
        ) from None
    if not key:
        raise ValueError("is empty after the whsec_ prefix")
    return key


def webhook_id(event_ids: Sequence[str]) -> str:
    """The `webhook-id` of a request: the CloudEvent id, or a stable id for a batch.

    One event: its id, so receivers can de-duplicate on the same key in both the signature
    headers and the event. Several events (batch mode): a UUIDv5 of the ids in order, which
    is stable across retries of the same batch, as the dispatcher retries batches unchanged.
    """
    if len(event_ids) == 1:
        return event_ids[0]
    return str(uuid.uuid5(_BATCH_NAMESPACE, "\n".join(event_ids)))


def is_attribute_header(name: str) -> bool:
    """Whether a header carries a stored attribute in binary mode (`ce-*`, `content-type`)."""
    lowered = name.lower()
    return lowered.startswith("ce-") or lowered == "content-type"


def attributes_block(headers: Iterable[tuple[str, str]]) -> bytes:
    """The canonical form of the binary-mode attributes among `headers` (module docstring).

    Unambiguous: a header name holds no `:` and no line feed, a value no line feed, and
    every entry starts with a non-empty name, so the empty line ends the block."""
    entries = sorted(
        f"{name.lower()}:{value.strip()}\n" for name, value in headers if is_attribute_header(name)
    )
    return ("".join(entries) + "\n").encode("utf-8", "surrogateescape")


def signed_prefix(msg_id: str, timestamp: str | int, attributes: bytes = b"") -> bytes:
    """What precedes the body in the signed content: `id.timestamp.` (and the attributes)."""
    return f"{msg_id}.{timestamp}.".encode("utf-8", "surrogateescape") + attributes


def hmac_sha256(key: bytes, content: bytes = b"") -> hmac.HMAC:
    """The HMAC of a signature; a receiver feeds the body into it as the body streams in.

    A copy of the key's HMAC state (`_keyed`): the key's padding and its two first hash
    blocks are computed once per key, not once per request (the same bytes, the same MAC)."""
    mac = _keyed(key).copy()
    mac.update(content)
    return mac


@functools.lru_cache(maxsize=64)
def _keyed(key: bytes) -> hmac.HMAC:
    """The HMAC-SHA256 state of `key` before any content (copied, never fed). Bounded: a
    service holds a few secrets (two during a rotation); a sink signs with the same few."""
    return hmac.new(key, digestmod=hashlib.sha256)


def encode_signature(version: str, digest: bytes) -> str:
    return f"{version}," + base64.b64encode(digest).decode("ascii")


def standard_headers(
    msg_id: str,
    timestamp: int,
    body: bytes,
    keys: Sequence[bytes],
    attributes: bytes | None = None,
) -> dict[str, str]:
    """`webhook-id`, `webhook-timestamp` and `webhook-signature` for `body`.

    The signed content is `id.timestamp.body`; one `v1,<base64>` per key, space separated,
    so receivers holding either the old or the new secret verify during a rotation. With
    `attributes` (binary mode: `attributes_block` of the request's headers), one
    `v1ce,<base64>` per key too, over `id.timestamp.` + attributes + body.
    """
    prefix = signed_prefix(msg_id, timestamp)
    signatures = " ".join(
        encode_signature(BODY_VERSION, hmac_sha256(key, prefix + body).digest()) for key in keys
    )
    if attributes is not None:
        signed = signed_prefix(msg_id, timestamp, attributes) + body
        signatures += "".join(
            " " + encode_signature(ATTRIBUTES_VERSION, hmac_sha256(key, signed).digest())
            for key in keys
        )
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
    }


def github_headers(body: bytes, key: bytes) -> dict[str, str]:
    """`X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`, as GitHub sends it.

    GitHub's scheme has room for one signature only, so only the first secret signs.
    """
    digest = hmac.new(key, body, hashlib.sha256).hexdigest()
    return {GITHUB_HEADER: f"sha256={digest}"}


# -- verifying (the fleet's `http` source) ------------------------------------------------

#: Signatures of one webhook-signature header looked at, at most.
MAX_SIGNATURES: Final = 16
_TIMESTAMP: Final = re.compile(r"[0-9]{1,12}")
_MESSAGE_ID: Final = re.compile(r"[^\x00-\x1f\x7f]{1,1024}")  # an event id: any text
_BASE64: Final = re.compile(r"[A-Za-z0-9+/]{4,128}={0,2}")


class SignatureError(ValueError):
    """Signature headers that cannot verify, whatever the body: the message says why (never
    with a secret), `kind` how (`missing`, `malformed`, `stale`, `unsigned-attributes`)."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.kind = kind


@dataclass(slots=True)
class Verification:
    """A Standard Webhooks signature to check once the body is in: one HMAC per (key,
    version), fed the body as it streams, and the signatures the request claims."""

    macs: list[tuple[hmac.HMAC, str]]
    claimed: list[tuple[str, bytes]]

    def update(self, chunk: bytes) -> None:
        for mac, _version in self.macs:
            mac.update(chunk)

    def verified(self) -> bool:
        found = False
        for mac, version in self.macs:
            digest = mac.digest()
            for claimed_version, claimed in self.claimed:
                if claimed_version == version and hmac.compare_digest(digest, claimed):
                    found = True
        return found


def claimed_signatures(header: str) -> list[tuple[str, bytes]]:
    """The `version,base64` signatures of a webhook-signature header; `SignatureError` when
    none is readable (a malformed header is a refusal, never a crash)."""
    found = []
    for part in header.split()[:MAX_SIGNATURES]:
        version, _, value = part.partition(",")
        if not _BASE64.fullmatch(value):
            continue
        try:
            found.append((version, base64.b64decode(value, validate=True)))
        except (binascii.Error, ValueError):
            continue
    if not found:
        raise SignatureError("malformed webhook-signature: expected v1,<base64>", "malformed")
    return found


def verification(
    headers: Mapping[str, str],
    keys: Sequence[bytes],
    *,
    binary: bool,
    body_only_in_binary: bool,
    tolerance: float,
    now: float,
) -> Verification:
    """What to check a request's body against, from its headers alone; `SignatureError` when
    the headers cannot verify (missing, malformed, a timestamp more than `tolerance` seconds
    from `now`, no signature of a version taken).

    Structured and batch mode (`binary` false) take `v1` signatures; binary mode takes `v1ce`
    (the `ce-*` attributes signed too) and, with `body_only_in_binary`, old senders' `v1`.
    """
    msg_id = headers.get("webhook-id", "")
    stamp = headers.get("webhook-timestamp", "")
    signatures = headers.get("webhook-signature", "")
    if not msg_id or not stamp or not signatures:
        raise SignatureError(
            "unsigned: webhook-id, webhook-timestamp and webhook-signature are required",
            "missing",
        )
    if not _MESSAGE_ID.fullmatch(msg_id):
        raise SignatureError("malformed webhook-id", "malformed")
    if not _TIMESTAMP.fullmatch(stamp):
        raise SignatureError("malformed webhook-timestamp: expected Unix seconds", "malformed")
    if abs(now - int(stamp)) > tolerance:
        raise SignatureError("webhook-timestamp is too far from now", "stale")
    claimed = claimed_signatures(signatures)
    versions = [BODY_VERSION]
    attributes = b""
    if binary:
        versions = [ATTRIBUTES_VERSION]
        if body_only_in_binary:
            versions.append(BODY_VERSION)
        attributes = attributes_block(headers.items())
    claimed = [(version, value) for version, value in claimed if version in versions]
    if not claimed:
        if binary:
            raise SignatureError(
                "binary mode: no v1ce signature, which covers the ce-* attributes "
                "(upgrade the sender, or set binary_unsigned_attributes = true)",
                "unsigned-attributes",
            )
        raise SignatureError("no v1 signature in webhook-signature", "malformed")
    macs = []
    for version in versions:
        prefix = signed_prefix(msg_id, stamp, attributes if version == ATTRIBUTES_VERSION else b"")
        macs += [(hmac_sha256(key, prefix), version) for key in keys]
    return Verification(macs, claimed)
