"""What a verified attestation says: the instance, as its cloud named it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

#: How the instance was attested.
Method = Literal["gce_iit", "azure_msi", "azure_attested", "aws_iid"]


class AttestationError(Exception):
    """A document that proves nothing: the message says why (it is the 401/403 reason).

    `status` is 401 for a document or credential that does not verify, 403 for a valid one
    about another VM than the one the request claims (or a refused repeat of AWS's)."""

    def __init__(self, reason: str, status: int = 401) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True, slots=True)
class Attested:
    """The instance a document names. `id` is None where the document does not carry it (an
    Azure token names the resource, not the vmId); `source` is the CloudEvents source the
    sidecar's events carry (GCE: built from project, zone and name; Azure: the resource id),
    None where the document does not name it: Azure's attested document (vmId and
    subscription only) and AWS's (the ARN's parts, not the ARN), whose enrollment checks the
    claimed source against those parts and binds it."""

    provider: str
    method: Method
    id: str | None = None
    name: str | None = None
    zone: str | None = None
    location: str | None = None
    project: str | None = None
    subscription: str | None = None
    account: str | None = None
    resource_id: str | None = None
    source: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Attested:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in value.items() if k in known})
