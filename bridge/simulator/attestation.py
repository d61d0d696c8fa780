"""The simulator's own signing keys: what the three clouds sign their identity documents with,
played by keys made when the simulator starts (never a vendor's key, never kept on disk).

- `jwt(claims)`: an RS256 JWT with a `kid`, as Google (the GCE identity token) and Entra ID
  (an Azure managed-identity token) sign them; the JWKS a verifier needs is in `trust()`.
- `pkcs7(content)`: a CMS SignedData holding the content, signed by a certificate the
  simulator's CA issued (Azure's attested document; AWS's `rsa2048` and `pkcs7` documents).
- `signature(content)`: a bare RSA PKCS#1 v1.5 SHA-256 signature (AWS's `signature`).

With `forged=True` the same shapes are signed by a key nobody publishes (its certificate
issued by a CA nobody trusts): the `bad_signature` fault. `trust()` is what
`GET /_sim/identity/trust` serves, the configuration a fleet verifying the simulator needs.

Built with `cryptography` (keys, certificates, the PKCS#7 builder) and PyJWT: no crypto here
by hand.
"""

from __future__ import annotations

import base64
import datetime
import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Final

#: The DNS name on the certificate signing attested documents (Azure's is metadata.azure.com).
SIGNER_NAME: Final = "metadata.simulator.invalid"
_VALIDITY: Final = datetime.timedelta(days=30)


@dataclass(frozen=True)
class _Key:
    kid: str
    private: Any  # rsa.RSAPrivateKey
    certificate: Any  # x509.Certificate
    ca: Any  # x509.Certificate


def _key_usage(*, ca: bool) -> Any:
    """What a key may sign: a CA's certificates and CRLs only, a leaf's documents only."""
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _issue(name: str, ca_name: str) -> _Key:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_subject)
        .issuer_name(ca_subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    kid = hashlib.sha256(der).hexdigest()[:16]
    return _Key(kid, key, certificate, ca)


class Signer:
    """The simulator's signing keys (made on first use: a few hundred milliseconds)."""

    @functools.cached_property
    def _key(self) -> _Key:
        return _issue(SIGNER_NAME, "maintenance-bridge simulator CA")

    @functools.cached_property
    def _forged(self) -> _Key:
        return _issue(SIGNER_NAME, "maintenance-bridge simulator CA")

    def _pick(self, forged: bool) -> _Key:
        real = self._key
        if not forged:
            return real
        # the forger knows the key id it imitates, not the key
        return _Key(real.kid, self._forged.private, self._forged.certificate, self._forged.ca)

    def jwt(self, claims: dict[str, Any], *, forged: bool = False) -> str:
        import jwt

        key = self._pick(forged)
        return jwt.encode(claims, key.private, algorithm="RS256", headers={"kid": key.kid})

    def pkcs7(self, content: bytes, *, forged: bool = False) -> bytes:
        """DER CMS SignedData with `content` inside and the signer's certificate."""
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.serialization import pkcs7

        key = self._pick(forged)
        return (
            pkcs7.PKCS7SignatureBuilder()
            .set_data(content)
            .add_signer(key.certificate, key.private, hashes.SHA256())
            .sign(serialization.Encoding.DER, [pkcs7.PKCS7Options.Binary])
        )

    def signature(self, content: bytes, *, forged: bool = False) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        key = self._pick(forged)
        signed: bytes = key.private.sign(content, padding.PKCS1v15(), hashes.SHA256())
        return signed

    def trust(self) -> dict[str, Any]:
        """The trust material a fleet verifying this simulator is configured with: the JWKS
        (GCE and Azure tokens), the CA of the attested documents' certificates (Azure), the
        signing certificate itself (AWS publishes its per-region certificate so)."""
        import jwt
        from cryptography.hazmat.primitives import serialization

        key = self._key
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.private.public_key()))
        jwks = {"keys": [jwk | {"kid": key.kid, "use": "sig", "alg": "RS256"}]}
        pem = serialization.Encoding.PEM
        return {
            "jwks": jwks,
            "ca_pem": key.ca.public_bytes(pem).decode(),
            "certificate_pem": key.certificate.public_bytes(pem).decode(),
            "signer_name": SIGNER_NAME,
        }


def b64(data: bytes) -> str:
    """Base64 in 64-character lines, as IMDS serves its PKCS#7 bodies."""
    text = base64.b64encode(data).decode()
    return "\n".join(text[i : i + 64] for i in range(0, len(text), 64))
