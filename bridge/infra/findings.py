"""What a `doctor` check reports: a verdict, what was seen and, when wrong, the fix.

Here, below every package, so that each component keeps its own checks beside it (the
coordination engine's, a provider's) and `bridge.surface.doctor` only runs and renders them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

Verdict = Literal["ok", "warn", "fail", "skip"]


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    verdict: Verdict
    detail: str
    fix: str = ""


#: Where the three clouds' metadata services answer by address (no name to resolve).
METADATA_ADDRESS: Final = "169.254.169.254"


def dns_fix(host: str | None, alternative: str = "") -> str:
    """The fix for a host name that does not resolve: this host's DNS, not the network path
    (a firewall or a proxy would be the wrong place to look)."""
    name = host or "the host name"
    return (
        f"{name} does not resolve here (DNS): check this host's resolver (/etc/resolv.conf, "
        "systemd-resolved; in a container, its DNS settings)"
        + (alternative or ", or use an IP address")
    )
