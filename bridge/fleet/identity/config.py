"""`[fleet.identity]`: the trust material, the fleet's audience and its credential key.

```toml
[fleet.identity]
audience = "https://fleet.example.com"       # the GCE token's aud, the Azure token's resource
credential_key = "env:FLEET_CREDENTIAL_KEY"  # >= 32 bytes; signs the enrolled credentials
credential_ttl = 3600                        # seconds a credential lasts (renewed before)
gce_jwks = "/etc/maintenance-bridge/trust/google.jwks.json"
azure_jwks = "/etc/maintenance-bridge/trust/entra.jwks.json"
azure_ca = "/etc/maintenance-bridge/trust/azure-ca.pem"
aws_certificate = "/etc/maintenance-bridge/trust/aws.pem"
```

Each source then says how much it asks: `identity = "off" | "optional" | "required"` in its
`[[fleet.sources]]` table. The trust files take a path, `file:PATH` or `env:VAR` (as the TLS
files do) and are reread when they change.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from bridge.infra.secrets import Secret
from bridge.infra.tls import Pem
from bridge.infra.validation import FieldError

from .credential import MIN_KEY_BYTES, Credentials
from .trust import TrustFiles
from .verify import Policy

#: Per source: no identity; attested events marked (and bad credentials refused); or only
#: events of enrolled instances.
IdentityMode = Literal["off", "optional", "required"]
TRUST_KEYS = ("gce_jwks", "azure_jwks", "azure_ca", "aws_certificate")


class IdentityConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    audience: str
    credential_key: Secret
    credential_ttl: Annotated[float, msgspec.Meta(ge=60, le=7 * 86400)] = 3600.0
    gce_jwks: str | None = None
    azure_jwks: str | None = None
    azure_ca: str | None = None
    aws_certificate: str | None = None
    azure_signer_name: str = "metadata.azure.com"

    def __post_init__(self) -> None:
        if not self.audience:
            raise FieldError("audience", "required: the fleet's URL or another unique name")
        if len(self.credential_key.get_secret_value().encode()) < MIN_KEY_BYTES:
            raise FieldError("credential_key", f"needs at least {MIN_KEY_BYTES} bytes")
        if not any(getattr(self, key) for key in TRUST_KEYS):
            raise FieldError(
                "gce_jwks",
                f"give the trust material of one cloud at least: {', '.join(TRUST_KEYS)}",
            )
        self.trust_files()

    def trust_files(self) -> TrustFiles:
        pems: dict[str, Pem | None] = {}
        for key in TRUST_KEYS:
            value = getattr(self, key)
            try:
                pems[key] = Pem.parse(value) if value else None
            except ValueError as exc:
                raise FieldError(key, str(exc)) from None
            found = pems[key]
            if found is not None and found.path is not None and not found.path.is_file():
                raise FieldError(key, f"no file {found.path}")
        return TrustFiles(**pems)

    def policy(self) -> Policy:
        return Policy(audience=self.audience, azure_signer_name=self.azure_signer_name)

    def credentials(self) -> Credentials:
        key = self.credential_key.get_secret_value().encode()
        return Credentials(key, self.audience, self.credential_ttl)
