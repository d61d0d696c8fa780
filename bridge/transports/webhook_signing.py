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
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import uuid
from collections.abc import Iterable, Sequence
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
    """The HMAC of a signature; a receiver feeds the body into it as the body streams in."""
    return hmac.new(key, content, hashlib.sha256)


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
