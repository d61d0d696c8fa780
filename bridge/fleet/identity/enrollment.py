"""`POST /v1/enroll`: a sidecar's identity document in, a credential bound to its instance
out (see `credential`).

The request (JSON, at most `MAX_REQUEST` bytes)::

    {"method": "gce_iit" | "azure_msi" | "azure_attested" | "aws_iid" | "renew",
     "source": "<the CloudEvents source the sidecar's events carry>",
     "document": "<the JWT, the attested document's signature, the AWS document, or (renew)
                  the current credential>",
     "signature": "<AWS: the document's signature>", "nonce": "<Azure attested: the nonce>"}

The document is verified (`verify`); then the claimed `source` must be the attested
instance's (403 otherwise: a valid document of another VM, or a wrong resource). An AWS
document is accepted once per instance (`ledger`): it has no audience, nonce or expiry, so a
copy could be replayed by anyone who read it; a second enrollment of the same instance is
refused (403) until an operator allows it. GCE and Azure tokens expire within hours, so those
sidecars simply enroll again when their credential nears its end.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any, Final, Protocol

from . import verify
from .binding import same_id
from .credential import Credentials, Issued
from .model import AttestationError, Attested
from .trust import TrustFiles

MAX_REQUEST: Final = 32 * 1024
_SUBSCRIPTION: Final = re.compile(r"/subscriptions/([^/]+)/", re.IGNORECASE)
_AWS_PARTITIONS: Final = ("aws", "aws-cn", "aws-us-gov")


class Ledger(Protocol):
    """Where first uses of AWS documents are recorded (the fleet store)."""

    async def first_use(self, instance: str, now: float) -> bool:
        """Record an attestation of `instance`; False if one was recorded before and no
        operator has allowed another since."""
        ...

    async def record(self, instance: str, method: str, now: float) -> None:
        """Record an attestation that may repeat (GCE, Azure)."""
        ...


def _text(request: dict[str, Any], key: str) -> str:
    value = request.get(key)
    if not isinstance(value, str) or not value:
        raise AttestationError(f"enrollment needs {key!r} (a non-empty string)", 400)
    return value


def parse(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_REQUEST:
        raise AttestationError(f"enrollment request larger than {MAX_REQUEST} bytes", 413)
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise AttestationError(f"enrollment request is not JSON: {exc}", 400) from exc
    if not isinstance(request, dict):
        raise AttestationError("enrollment request must be a JSON object", 400)
    return request


class Enroller:
    """Verifies enrollment requests and issues credentials."""

    def __init__(
        self, trust: TrustFiles, policy: verify.Policy, credentials: Credentials, ledger: Ledger
    ) -> None:
        self.trust = trust
        self.policy = policy
        self.credentials = credentials
        self.ledger = ledger

    def _verify(self, request: dict[str, Any]) -> Attested:
        method = _text(request, "method")
        document = _text(request, "document")
        if method == "gce_iit":
            return verify.gce(document, self.trust, self.policy)
        if method == "azure_msi":
            return verify.azure_token(document, self.trust, self.policy)
        if method == "azure_attested":
            return verify.azure_attested(document, _text(request, "nonce"), self.trust, self.policy)
        if method == "aws_iid":
            return verify.aws(document, _text(request, "signature"), self.trust)
        raise AttestationError(
            f"unknown method {method!r}: gce_iit, azure_msi, azure_attested or aws_iid", 400
        )

    async def enroll(self, body: bytes, now: float) -> Issued:
        request = parse(body)
        source = _text(request, "source")
        if request.get("method") == "renew":
            # a credential still valid buys its successor: no document needed (AWS's could
            # not be presented twice), one HMAC check
            attested = self.credentials.check(_text(request, "document"))
            if not _same_source(attested, source):
                raise AttestationError(f"the credential names {attested.source!r}", 403)
            return replace(self.credentials.issue(attested, now), renewed=True)
        attested = self._verify(request)
        if attested.source is None:
            _check_claim(attested, source)
            attested = replace(attested, source=source)  # bound from now on
        elif not _same_source(attested, source):
            raise AttestationError(f"the document names {attested.source!r}, not {source!r}", 403)
        else:
            attested = replace(attested, source=source)  # the events' spelling (Azure: case)
        if attested.method != "aws_iid":
            await self.ledger.record(str(attested.source), attested.method, now)
        elif not await self.ledger.first_use(str(attested.source), now):
            raise AttestationError(
                f"instance {attested.id} was attested before: an AWS identity document is "
                "accepted once (it can be replayed); an operator allows a new attestation "
                "with `maintenance-bridge fleet identity allow`",
                403,
            )
        return self.credentials.issue(attested, now)


def _check_claim(attested: Attested, source: str) -> None:
    """A source the document does not spell out must agree with what it does name: Azure's
    attested document (the subscription), AWS's (region, account and instance id of the ARN,
    in any of AWS's partitions)."""
    if attested.provider == "aws":
        expected = f":ec2:{attested.location}:{attested.account}:instance/{attested.id}"
        partition, _, rest = source.removeprefix("arn:").partition(":")
        if source.startswith("arn:") and partition in _AWS_PARTITIONS and f":{rest}" == expected:
            return
        raise AttestationError(
            f"the document names instance {attested.id} ({expected[1:]}), not {source!r}", 403
        )
    found = _SUBSCRIPTION.match(source)
    if found is None or found[1].lower() != str(attested.subscription).lower():
        raise AttestationError(
            f"source {source!r} is not in the attested subscription {attested.subscription}",
            403,
        )


def _same_source(attested: Attested, source: str) -> bool:
    return attested.source is not None and same_id(attested.provider, source, attested.source)
