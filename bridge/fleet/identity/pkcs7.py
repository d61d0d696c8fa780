"""PKCS#7 / CMS SignedData verification: asn1crypto reads the structure, `cryptography`
verifies the signature and the certificate chain (no ASN.1 by hand, no crypto by hand).

What is checked, in order: one SignerInfo; its certificate is in the message and chains to a
configured CA for the expected name (a web-PKI server certificate, as Azure's
metadata.azure.com is); the signed attributes' message digest is the content's; the
signature over the signed attributes verifies with the certificate's key.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from typing import Any, Final

from .model import AttestationError

_DIGESTS: Final = {"sha256": hashlib.sha256, "sha384": hashlib.sha384, "sha512": hashlib.sha512}


def signed_content(der: bytes, cas: list[Any], name: str, now: dt.datetime | None = None) -> bytes:
    """The content of a SignedData whose signer chains to one of `cas` as `name`."""
    from asn1crypto import cms
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding, rsa
    from cryptography.x509 import verification

    try:
        info = cms.ContentInfo.load(der)
        if info["content_type"].native != "signed_data":
            raise AttestationError("the PKCS#7 document is not SignedData")
        signed = info["content"]
        content = signed["encap_content_info"]["content"].native
        signers = list(signed["signer_infos"])
        certificates = [
            x509.load_der_x509_certificate(choice.chosen.dump())
            for choice in signed["certificates"]
            if choice.name == "certificate"
        ]
    except (ValueError, TypeError, KeyError) as exc:
        raise AttestationError(f"the PKCS#7 document does not parse: {exc}") from exc
    if not isinstance(content, bytes) or len(signers) != 1:
        raise AttestationError("the PKCS#7 document needs its content and exactly one signer")
    signer = signers[0]
    sid = signer["sid"]
    if sid.name != "issuer_and_serial_number":
        raise AttestationError("the PKCS#7 signer is not named by issuer and serial number")
    serial = sid.chosen["serial_number"].native
    leaf = next((c for c in certificates if c.serial_number == serial), None)
    if leaf is None:
        raise AttestationError("the PKCS#7 signer's certificate is not in the document")
    try:
        builder = verification.PolicyBuilder().store(verification.Store(cas))
        builder = builder.time(now or dt.datetime.now(dt.UTC))
        verifier = builder.build_server_verifier(x509.DNSName(name))
        verifier.verify(leaf, [c for c in certificates if c is not leaf])
    except verification.VerificationError as exc:
        raise AttestationError(f"the PKCS#7 signer's certificate is not trusted: {exc}") from exc
    digest_name = signer["digest_algorithm"]["algorithm"].native
    digest = _DIGESTS.get(digest_name)
    if digest is None:
        raise AttestationError(f"the PKCS#7 digest {digest_name} is not accepted")
    attributes = signer["signed_attrs"]
    if not attributes:
        raise AttestationError("the PKCS#7 signer has no signed attributes")
    declared = next(
        (a["values"][0].native for a in attributes if a["type"].native == "message_digest"), None
    )
    if not isinstance(declared, bytes) or not hmac.compare_digest(
        declared, digest(content).digest()
    ):
        raise AttestationError("the PKCS#7 message digest is not the content's")
    key = leaf.public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise AttestationError("the PKCS#7 signer's key is not RSA")
    algorithm = {"sha256": hashes.SHA256(), "sha384": hashes.SHA384(), "sha512": hashes.SHA512()}
    try:
        # the signature covers the attributes as a SET OF, not as the [0]-tagged field
        key.verify(
            signer["signature"].native,
            attributes.untag().dump(force=True),
            padding.PKCS1v15(),
            algorithm[digest_name],
        )
    except InvalidSignature as exc:
        raise AttestationError("the PKCS#7 signature does not verify") from exc
    return content
