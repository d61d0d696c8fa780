"""The fleet's credential: issued for an instance, checked once per token (then remembered
until it expires), refused when forged, expired, for another fleet, or too long."""

from __future__ import annotations

import gc
import time
import tracemalloc
from dataclasses import replace

import pytest

from bridge.fleet.identity import credential
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


AZURE_VM = Attested(
    provider="azure",
    method="azure_msi",
    name="web-2",
    subscription="8c56d827-5f07-45ce-8f2b-6c5001db5c6f",
    resource_id="/subscriptions/8c56d827-5f07-45ce-8f2b-6c5001db5c6f/resourceGroups/rg/"
    "providers/Microsoft.Compute/virtualMachines/web-2",
    source="/subscriptions/8c56d827-5f07-45ce-8f2b-6c5001db5c6f/resourceGroups/rg/"
    "providers/Microsoft.Compute/virtualMachines/web-2",
)
AWS_VM = Attested(
    provider="aws",
    method="aws_iid",
    id="i-0123456789abcdef0",
    name="i-0123456789abcdef0",
    zone="eu-west-1a",
    location="eu-west-1",
    account="123456789012",
)


@pytest.mark.parametrize("vm", [VM, AZURE_VM, AWS_VM], ids=lambda vm: vm.provider)
def test_a_remembered_credential_names_its_whole_instance(vm: Attested) -> None:
    """The fleet remembers a digest of each credential, not its instance: the instance is
    read again from the token's payload, every name of each cloud's as it was issued."""
    issuer = Credentials(b"k" * 32, "https://fleet", 3600)
    replica = Credentials(b"k" * 32, "https://fleet", 3600)
    token = issuer.issue(vm).token
    assert issuer.check(token) == vm  # issued here: remembered from the start
    assert replica.check(token) == vm  # verified with PyJWT
    assert replica.check(token) == vm  # remembered
    tampered = token.replace(".", ".x", 1)  # another token: the digest does not know it
    with pytest.raises(AttestationError, match="invalid"):
        replica.check(tampered)


def test_the_fleet_remembers_a_fleet_of_credentials_in_bounded_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """100,000 sidecars, each with a renewed credential beside its last one, are all
    remembered (none costs PyJWT's checks again), in about 150 bytes each: a digest and an
    expiry (15 MiB for 100,000, where the tokens and their instances took some 1.5 KiB each).
    The `RECENT` last used, kept whole besides, are 1.5 MiB at most (left out here)."""
    assert credential.CACHED >= 2 * 100_000
    assert credential.RECENT <= 1_024
    monkeypatch.setattr(credential, "RECENT", 0)
    issuer = Credentials(b"k" * 32, "https://fleet", 3600)
    tokens = [issuer.issue(replace(VM, id=str(n), name=f"vm-{n}")).token for n in range(5_000)]
    replica = Credentials(b"k" * 32, "https://fleet", 3600)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for token in tokens:
            replica.check(token)
        gc.collect()
        held = sum(d.size_diff for d in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert held / len(tokens) < 200
    assert held / len(tokens) * credential.CACHED < 50 * 2**20


def test_past_its_bound_the_oldest_credentials_are_checked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past `CACHED`, the oldest tenth is forgotten at once; such a credential, still
    valid, costs one PyJWT check when it comes again, and is remembered again."""
    import jwt

    monkeypatch.setattr(credential, "CACHED", 10)
    monkeypatch.setattr(credential, "RECENT", 0)  # every check goes to the digests
    issuer = Credentials(b"k" * 32, "https://fleet", 3600)
    tokens = [issuer.issue(replace(VM, id=str(n))).token for n in range(11)]
    decode = jwt.decode
    decoded: list[str] = []

    def counted(*args: object, **kwargs: object) -> object:
        decoded.append(str(args[0]))
        return decode(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(jwt, "decode", counted)
    assert [issuer.check(t).id for t in tokens[2:]] == [str(n) for n in range(2, 11)]
    assert decoded == []
    assert issuer.check(tokens[0]).id == "0"  # forgotten as one of the oldest, still valid
    assert issuer.check(tokens[0]).id == "0"  # and remembered again
    assert decoded == [tokens[0]]


def test_a_credential_used_again_soon_is_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last used credentials are kept with their instance (a sidecar draining its
    spool sends one many times in a row): no digest, no payload read."""
    issuer = Credentials(b"k" * 32, "https://fleet", 3600)
    token = issuer.issue(VM).token
    assert issuer.check(token) is issuer.check(token)

    def unexpected(_: str) -> Attested:
        raise AssertionError("the payload was read again")

    monkeypatch.setattr(credential, "_instance", unexpected)
    assert issuer.check(token) == VM
