"""Request signatures of the webhook sink: Standard Webhooks and GitHub-style HMAC.

Kept apart from the transport so the exact byte layout that receivers verify is in one
small, pure module. Both schemes sign the *exact* body bytes that go on the wire: the caller
serializes once and hands the same `bytes` object to the signer and to the HTTP client, so a
re-serialization (key order, whitespace) can never make a valid event fail verification.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import uuid
from collections.abc import Sequence
from typing import Final

#: Prefix of Standard Webhooks secrets; the rest is base64 of the HMAC key.
SECRET_PREFIX: Final = "whsec_"  # noqa: S105 (a prefix, not a secret)
GITHUB_HEADER: Final = "X-Hub-Signature-256"

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


def standard_headers(
    msg_id: str, timestamp: int, body: bytes, keys: Sequence[bytes]
) -> dict[str, str]:
    """`webhook-id`, `webhook-timestamp` and `webhook-signature` for `body`.

    The signed content is `id.timestamp.body`; one `v1,<base64>` per key, space separated,
    so receivers holding either the old or the new secret verify during a rotation.
    """
    signed = f"{msg_id}.{timestamp}.".encode() + body
    signatures = " ".join(
        "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode("ascii")
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
