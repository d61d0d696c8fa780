"""The fleet's credential: issued for an instance, checked once per token (then remembered
until it expires), refused when forged, expired, for another fleet, or too long."""

from __future__ import annotations

import time

import pytest

from bridge.fleet.identity.credential import MAX_LENGTH, Credentials
from bridge.fleet.identity.model import AttestationError, Attested

VM = Attested(
    provider="gce",
    method="gce_iit",
    id="4520031799277582256",
    name="sim-vm-1",
    zone="us-central1-a",
    project="sim-project",
    source="//compute.googleapis.com/projects/sim-project/zones/us-central1-a/instances/sim-vm-1",
)


def test_a_credential_names_its_instance_and_fits_a_bus_attribute() -> None:
    credentials = Credentials(b"k" * 32, "https://fleet", 3600)
    issued = credentials.issue(VM)
    assert len(issued.token) <= MAX_LENGTH
    assert credentials.check(issued.token) == VM
    assert credentials.check(issued.token) == VM  # remembered


def test_a_credential_this_fleet_issued_is_known_without_decoding_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sidecar's first post after enrolling costs no decode on the replica that issued
    its credential (PyJWT's checks are most of what identity costs a small post); another
    replica, sharing the key, decodes it once."""
    import jwt

    issuer = Credentials(b"k" * 32, "https://fleet", 3600)
    replica = Credentials(b"k" * 32, "https://fleet", 3600)
    token = issuer.issue(VM).token
    decode = jwt.decode
    decoded: list[str] = []

    def counted(*args: object, **kwargs: object) -> object:
        decoded.append(str(args[0]))
        return decode(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(jwt, "decode", counted)
    assert issuer.check(token) == VM
    assert decoded == []
    assert replica.check(token) == VM
    assert replica.check(token) == VM
    assert decoded == [token]


def test_forged_foreign_and_expired_credentials_are_refused() -> None:
    now = [time.time()]
    credentials = Credentials(b"k" * 32, "https://fleet", 3600, clock=lambda: now[0])
    other_fleet = Credentials(b"k" * 32, "https://other", 3600)
    other_key = Credentials(b"x" * 32, "https://fleet", 3600)
    with pytest.raises(AttestationError, match="invalid"):
        credentials.check(other_fleet.issue(VM).token)
    with pytest.raises(AttestationError, match="invalid"):
        credentials.check(other_key.issue(VM).token)
    with pytest.raises(AttestationError, match="expired"):
        credentials.check(credentials.issue(VM, now=time.time() - 7200).token)
    with pytest.raises(AttestationError, match="too long"):
        credentials.check("x" * (MAX_LENGTH + 1))

    token = credentials.issue(VM).token
    credentials.check(token)
    now[0] += 3601
    with pytest.raises(AttestationError, match="expired"):
        credentials.check(token)  # remembered, but not past its expiry


def test_a_short_key_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        Credentials(b"short", "https://fleet", 3600)


def test_a_credential_is_checked_at_the_time_a_bus_took_its_message() -> None:
    """A message may wait on a bus while the fleet is down: its credential counts as of the
    bus's own timestamp, never later than now (a future stamp extends nothing)."""
    now = [time.time()]
    credentials = Credentials(b"k" * 32, "https://fleet", 3600, clock=lambda: now[0])
    sent = now[0]
    token = credentials.issue(VM).token
    now[0] += 7200
    assert credentials.check(token, at=sent + 60) == VM
    with pytest.raises(AttestationError, match="expired"):
        credentials.check(token, at=now[0] + 60)
    with pytest.raises(AttestationError, match="expired"):
        credentials.check(token)
    assert credentials.check(token, at=sent) == VM  # still known: the refusal above kept it
