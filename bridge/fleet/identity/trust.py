"""Trust material as files: the JWKS of the token issuers (Google, Entra ID), the CA the
Azure attested document's certificate chains to, AWS's published signing certificates.

Hosts without internet access cannot fetch Google's or Microsoft's keys, so the fleet never
does: an operator (or a job that fetches them) writes the files, and `TrustFiles` rereads a
file when its `stat` changes, as `bridge.infra.tls` does for certificates (the same `Pem`
value forms: a path, `file:` or `env:`). A rewritten file that does not parse is logged and
the previous material stays in use, so a half-written rotation never unlocks or locks out
the fleet.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from bridge.infra.tls import Pem

from .model import AttestationError

log = logging.getLogger("bridge.fleet.identity")
_T = TypeVar("_T")


@dataclass
class _Watched(Generic[_T]):
    """One file's parsed content, reparsed when its stat changes."""

    source: Pem
    parse: Any  # Callable[[bytes], _T]
    _stamp: tuple[int, ...] | None = None
    _value: _T | None = None

    def get(self) -> _T:
        try:
            stamp = self.source.stamp()
        except OSError as exc:
            if self._value is None:
                raise AttestationError(f"trust material {self.source} unreadable: {exc}") from exc
            return self._value
        if stamp != self._stamp or self._value is None:
            try:
                self._value = self.parse(self.source.read())
            except (OSError, ValueError, TypeError, KeyError) as exc:
                if self._value is None:
                    raise AttestationError(f"trust material {self.source}: {exc}") from exc
                log.error(
                    "trust material %s not reloaded (keeping the previous): %s", self.source, exc
                )
            self._stamp = stamp
        assert self._value is not None
        return self._value


def _jwks(data: bytes) -> Any:
    import jwt

    document = json.loads(data)
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError('a JWKS is a JSON object {"keys": [...]}')
    try:
        return jwt.PyJWKSet.from_dict(document)
    except jwt.PyJWTError as exc:
        raise ValueError(str(exc)) from exc


def _certificates(data: bytes) -> list[Any]:
    from cryptography import x509

    found = x509.load_pem_x509_certificates(data)
    if not found:
        raise ValueError("no PEM certificate")
    return found


@dataclass
class TrustFiles:
    """The configured trust material (each optional: a cloud without it cannot attest)."""

    gce_jwks: Pem | None = None
    azure_jwks: Pem | None = None
    azure_ca: Pem | None = None
    aws_certificate: Pem | None = None
    _watched: dict[str, _Watched[Any]] = field(default_factory=dict, repr=False, init=False)

    def _get(self, name: str, parse: Any) -> Any:
        source = getattr(self, name)
        if source is None:
            raise AttestationError(f"no trust material configured for {name}")
        watched = self._watched.get(name)
        if watched is None or watched.source != source:
            watched = self._watched[name] = _Watched(source, parse)
        return watched.get()

    def jwks(self, provider: str) -> Any:
        """The PyJWKSet of `gce` or `azure` token issuers."""
        return self._get(f"{provider}_jwks", _jwks)

    def azure_cas(self) -> list[Any]:
        return list(self._get("azure_ca", _certificates))

    def aws_certificates(self) -> list[Any]:
        return list(self._get("aws_certificate", _certificates))
