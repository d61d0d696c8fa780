"""What the sidecar's enrollment, its sinks and the fleet share about the instance
credential (bridge/pipeline/enrollment.py issues the requests, bridge/fleet/identity/ the
credentials): where it travels and the `[identity]` settings. Here, at the bottom of the
layers, so the sinks and the configuration can name it without importing the pipeline."""

from __future__ import annotations

from typing import Final, Protocol

import msgspec

#: The HTTP header carrying the credential (webhook sink to the fleet's http source).
HEADER: Final = "Maintenance-Bridge-Credential"
#: The CloudEvents extension attribute carrying it on the buses (1,024 bytes at most there).
ATTRIBUTE: Final = "bridgecredential"


class AttestationUnavailable(Exception):
    """The VM cannot produce its identity document (GCE without a service account...)."""


class EnrollmentPending(Exception):
    """No credential yet: why (the sink retries later)."""


class IdentitySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """`[identity]`: where to enroll and the fleet's audience."""

    enroll_url: str
    audience: str
    timeout: float = 10.0


class CredentialSource(Protocol):
    """What a sink asks for the credential (`bridge.pipeline.enrollment.Enrollment`)."""

    async def credential(self) -> str:
        """A valid credential, or `EnrollmentPending`."""
        ...

    def invalidate(self) -> None:
        """The fleet refused it: get a new one before the next send."""
