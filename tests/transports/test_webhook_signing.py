"""`bridge.transports.webhook_signing`: what the webhook sink signs, the fleet's `http` source
verifies; both halves of one module, checked against each other here (pure functions, no
server; tests/fleet/test_http_source.py covers them over real HTTP)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from bridge.transports import webhook_signing as signing

KEY = b"k" * 32
OTHER = b"o" * 32
NOW = 1_700_000_000
BODY = b'{"specversion":"1.0","id":"e-1"}'
BINARY_HEADERS = [("ce-id", "e-1"), ("ce-source", "//vm/1"), ("content-type", "application/json")]


def signed(keys: list[bytes], *, binary: bool) -> dict[str, str]:
    attributes = signing.attributes_block(BINARY_HEADERS) if binary else None
    headers = signing.standard_headers("e-1", NOW, BODY, keys, attributes)
    return {**dict(BINARY_HEADERS), **headers} if binary else headers


def verifies(
    headers: dict[str, str],
    body: bytes = BODY,
    *,
    binary: bool = False,
    body_only_in_binary: bool = False,
) -> bool:
    check = signing.verification(
        headers,
        [KEY],
        binary=binary,
        body_only_in_binary=body_only_in_binary,
        tolerance=300.0,
        now=float(NOW),
    )
    for start in range(0, len(body), 7):  # the body streams in, in chunks
        check.update(body[start : start + 7])
    return check.verified()


def test_what_the_sink_signs_the_source_verifies_in_both_modes() -> None:
    assert verifies(signed([KEY], binary=False))
    assert verifies(signed([KEY], binary=True), binary=True)


def test_a_rotation_verifies_with_either_key_and_a_changed_body_with_none() -> None:
    assert verifies(signed([OTHER, KEY], binary=False))
    assert not verifies(signed([OTHER], binary=False))
    assert not verifies(signed([KEY], binary=False), body=BODY + b" ")


def test_binary_mode_signs_the_attributes_too() -> None:
    headers = signed([KEY], binary=True)
    assert not verifies({**headers, "ce-source": "//vm/2"}, binary=True)
    body_only = signing.standard_headers("e-1", NOW, BODY, [KEY])
    with pytest.raises(signing.SignatureError, match="no v1ce signature") as refused:
        verifies({**dict(BINARY_HEADERS), **body_only}, binary=True)
    assert refused.value.kind == "unsigned-attributes"
    assert verifies({**dict(BINARY_HEADERS), **body_only}, binary=True, body_only_in_binary=True)


@pytest.mark.parametrize(
    ("change", "kind", "reason"),
    [
        ({"webhook-id": ""}, "missing", "unsigned"),
        ({"webhook-timestamp": "yesterday"}, "malformed", "malformed webhook-timestamp"),
        ({"webhook-timestamp": str(NOW - 301)}, "stale", "too far from now"),
        ({"webhook-signature": "v1,???"}, "malformed", "malformed webhook-signature"),
    ],
)
def test_headers_that_cannot_verify_are_refused_before_the_body(
    change: dict[str, str], kind: str, reason: str
) -> None:
    with pytest.raises(signing.SignatureError, match=reason) as refused:
        verifies({**signed([KEY], binary=False), **change})
    assert refused.value.kind == kind


def test_the_key_state_kept_per_secret_is_never_fed_by_a_signature() -> None:
    """The HMAC starts from a copy of the key's state computed once (`_keyed`): every MAC
    is what a fresh `hmac.new` gives, however many were made from that key before."""
    for content in (b"", b"a.1.", BODY, b"a.1." + BODY):
        mac = signing.hmac_sha256(KEY, content)
        mac.update(b"more")
        assert mac.digest() == hmac.new(KEY, content + b"more", hashlib.sha256).digest()
    assert verifies(signed([KEY], binary=False))
    assert not verifies(signed([OTHER], binary=False))
    assert verifies(signed([KEY], binary=False))
