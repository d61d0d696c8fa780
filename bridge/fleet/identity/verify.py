"""Each cloud's identity document, verified: what SPIRE's `gcp_iit`, `azure_msi` and
`aws_iid` node attestors check, with PyJWT, `cryptography` and asn1crypto.

Every function returns the `Attested` instance or raises `AttestationError` with a reason
fit for the 401 answer (and the log). None trusts a field before the signature verified.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
import time
from dataclasses import dataclass
from typing import Any, Final

from .model import AttestationError, Attested
from .pkcs7 import signed_content
from .trust import TrustFiles

GOOGLE_ISSUERS: Final = ("https://accounts.google.com", "accounts.google.com")
#: Azure's resource id of a VM: the subscription, group and name it names.
_MIRID: Final = re.compile(
    r"/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<group>[^/]+)"
    r"/providers/microsoft\.compute/virtualmachines/(?P<name>[^/]+)",
    re.IGNORECASE,
)
_AZURE_ISSUER: Final = re.compile(r"https://sts\.windows\.net/[0-9a-f-]{36}/")
#: The attested document's nonce (a Unix time the sidecar chose) may be this old, seconds.
NONCE_WINDOW: Final = 300
#: An AWS document is at most this large (its real size is about 500 bytes).
MAX_DOCUMENT: Final = 16 * 1024


@dataclass(frozen=True)
class Policy:
    """What the fleet expects of a document beyond its signature."""

    #: The GCE token's `aud` and the Azure token's resource: the fleet's own name.
    audience: str
    #: The name on the certificate signing Azure's attested documents.
    azure_signer_name: str = "metadata.azure.com"
    #: Clock skew allowed on expiry checks, seconds.
    leeway: float = 30.0


def _jwt(token: str, keys: Any, audience: str, leeway: float) -> dict[str, Any]:
    import jwt

    try:
        kid = jwt.get_unverified_header(token).get("kid")
        key = next((k for k in keys.keys if k.key_id == kid), None)
        if key is None:
            raise AttestationError(f"token signed by an unknown key (kid {kid!r})")
        claims: dict[str, Any] = jwt.decode(
            token,
            key.key,
            algorithms=["RS256"],
            audience=audience,
            leeway=leeway,
            options={"require": ["exp", "iat", "iss", "aud"]},
        )
    except jwt.ExpiredSignatureError as exc:
        raise AttestationError("token expired") from exc
    except jwt.InvalidAudienceError as exc:
        raise AttestationError(f"token audience is not {audience!r}") from exc
    except jwt.InvalidSignatureError as exc:
        raise AttestationError("token signature does not verify") from exc
    except jwt.PyJWTError as exc:
        raise AttestationError(f"token invalid: {exc}") from exc
    return claims


def gce(token: str, trust: TrustFiles, policy: Policy) -> Attested:
    """The identity token (`format=full`): Google's signature, our audience, one hour."""
    claims = _jwt(token, trust.jwks("gce"), policy.audience, policy.leeway)
    if claims.get("iss") not in GOOGLE_ISSUERS:
        raise AttestationError(f"token issuer {claims.get('iss')!r} is not Google")
    engine = (claims.get("google") or {}).get("compute_engine")
    if not isinstance(engine, dict):
        raise AttestationError("token names no instance: request it with format=full")
    try:
        project, zone, name = engine["project_id"], engine["zone"], engine["instance_name"]
        instance_id = str(engine["instance_id"])
    except KeyError as exc:
        raise AttestationError(f"token's google.compute_engine lacks {exc}") from exc
    resource = f"projects/{project}/zones/{zone}/instances/{name}"
    return Attested(
        provider="gce",
        method="gce_iit",
        id=instance_id,
        name=name,
        zone=zone,
        project=project,
        resource_id=resource,
        source=f"//compute.googleapis.com/{resource}",
    )


def azure_token(token: str, trust: TrustFiles, policy: Policy) -> Attested:
    """A managed-identity access token for the fleet's resource, naming the VM in xms_mirid."""
    claims = _jwt(token, trust.jwks("azure"), policy.audience, policy.leeway)
    issuer = str(claims.get("iss", ""))
    if (
        not _AZURE_ISSUER.fullmatch(issuer)
        or issuer != f"https://sts.windows.net/{claims.get('tid')}/"
    ):
        raise AttestationError(f"token issuer {issuer!r} is not Entra ID's for its tenant")
    mirid = str(claims.get("xms_mirid", ""))
    found = _MIRID.fullmatch(mirid)
    if found is None:
        raise AttestationError("token's xms_mirid names no virtual machine")
    return Attested(
        provider="azure",
        method="azure_msi",
        id=None,
        name=found["name"],
        subscription=found["sub"],
        resource_id=mirid,
        source=mirid,
    )


def _azure_time(text: str) -> float:
    return dt.datetime.strptime(text, "%m/%d/%y %H:%M:%S %z").timestamp()


def azure_attested(
    signature: str, nonce: str, trust: TrustFiles, policy: Policy, now: float | None = None
) -> Attested:
    """The attested document (PKCS#7): Azure's certificate, our nonce, not expired."""
    now = time.time() if now is None else now
    try:
        der = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AttestationError("attested document is not base64") from exc
    content = signed_content(
        der, trust.azure_cas(), policy.azure_signer_name, dt.datetime.fromtimestamp(now, dt.UTC)
    )
    try:
        document = json.loads(content)
        vm_id, subscription = str(document["vmId"]), str(document["subscriptionId"])
        stamps = document["timeStamp"]
        expires = _azure_time(stamps["expiresOn"])
    except (ValueError, KeyError, TypeError) as exc:
        raise AttestationError(f"attested document unreadable: {exc}") from exc
    if expires + policy.leeway < now:
        raise AttestationError("attested document expired")
    if str(document.get("nonce")) != nonce:
        raise AttestationError("attested document's nonce is not the one asked for")
    if not nonce.isdigit() or abs(now - int(nonce)) > NONCE_WINDOW:
        raise AttestationError(f"attested document's nonce is older than {NONCE_WINDOW} s")
    return Attested(provider="azure", method="azure_attested", id=vm_id, subscription=subscription)


def aws(document: str, signature: str, trust: TrustFiles) -> Attested:
    """The instance identity document and its `signature`, by an AWS certificate."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    if len(document) > MAX_DOCUMENT:
        raise AttestationError(f"identity document larger than {MAX_DOCUMENT} bytes")
    try:
        raw = base64.b64decode("".join(signature.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AttestationError("identity document signature is not base64") from exc
    for certificate in trust.aws_certificates():
        key = certificate.public_key()
        if not isinstance(key, rsa.RSAPublicKey):
            continue
        try:
            key.verify(raw, document.encode(), padding.PKCS1v15(), hashes.SHA256())
        except InvalidSignature:
            continue
        break
    else:
        raise AttestationError("identity document signature does not verify")
    try:
        fields = json.loads(document)
        region, account = str(fields["region"]), str(fields["accountId"])
        instance_id = str(fields["instanceId"])
    except (ValueError, KeyError, TypeError) as exc:
        raise AttestationError(f"identity document unreadable: {exc}") from exc
    return Attested(
        provider="aws",
        method="aws_iid",
        id=instance_id,
        name=instance_id,
        zone=fields.get("availabilityZone"),
        location=region,
        account=account,
    )
