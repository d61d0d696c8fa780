"""Switchable faults, per provider, applied to vendor endpoints (never to ``/_sim/``).

Counted faults (``status_burst``, ``drop``, ``malformed``, ``missing_vendor_header``,
``redirect``) are consumed one per request, so a test can say "the next 3 requests fail" and
then observe recovery.  Flags (``hang``, ``rate_limit``), ``latency`` and ``attestation`` (what
the identity documents get wrong: each part's `attestation_faults`) stay until
changed.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .part import names, parts, spelled

#: A provider's name (its faults) or "all".
FaultTarget = str
RATE_LIMIT_PER_SECOND = 5


@dataclass
class FaultSet:
    """Faults of one provider.  ``rate_limit`` defaults to on where the vendor documents one
    (Azure: 5/s)."""

    provider: str
    rate_limited: bool = False
    status_burst: tuple[int, int] | None = None
    latency: float = 0.0
    drop: int = 0
    malformed: int = 0
    hang: bool = False
    rate_limit: bool = False
    missing_vendor_header: int = 0
    redirect: int = 0
    attestation: str = ""
    _hits: dict[str, deque[float]] = field(default_factory=dict)

    def reset(self) -> None:
        self.status_burst = None
        self.latency = 0.0
        self.drop = self.malformed = self.missing_vendor_header = self.redirect = 0
        self.hang = False
        self.attestation = ""
        self.rate_limit = self.rate_limited
        self._hits.clear()

    def as_dict(self) -> dict[str, Any]:
        return {
            "status_burst": list(self.status_burst) if self.status_burst else None,
            "latency": self.latency,
            "drop": self.drop,
            "malformed": self.malformed,
            "hang": self.hang,
            "rate_limit": self.rate_limit,
            "missing_vendor_header": self.missing_vendor_header,
            "redirect": self.redirect,
            "attestation": self.attestation or None,
        }

    def take(self, name: str) -> bool:
        """Consume one unit of a counted fault; True if this request is affected."""
        if name == "status_burst":
            if self.status_burst and self.status_burst[1] > 0:
                status, left = self.status_burst
                self.status_burst = (status, left - 1) if left > 1 else None
                return True
            return False
        left = int(getattr(self, name))
        if left > 0:
            setattr(self, name, left - 1)
            return True
        return False

    def over_rate_limit(self, client: str) -> bool:
        """Sliding one-second window per client; the request is counted either way."""
        if not self.rate_limit:
            return False
        now = time.monotonic()
        hits = self._hits.setdefault(client, deque())
        while hits and now - hits[0] >= 1.0:
            hits.popleft()
        hits.append(now)
        return len(hits) > RATE_LIMIT_PER_SECOND


#: The faults a provider can be given (`fault.set` in scenarios and the control API).
FIELDS = (
    "status_burst",
    "latency",
    "drop",
    "malformed",
    "hang",
    "rate_limit",
    "missing_vendor_header",
    "redirect",
    "attestation",
)


def _attestation_fault(provider: str, value: Any) -> str:
    from .part import part

    known = part(provider).attestation_faults
    if value in (None, "", False):
        return ""
    if value not in known:
        raise ValueError(
            f"{provider} attestation faults are {spelled(known) if known else 'none'}, "
            f"not {value!r}"
        )
    return str(value)


class Faults:
    """``sim.faults``: ``set(provider=..., **faults)`` and ``clear()``; ``faults.<provider>``
    is one provider's `FaultSet`."""

    def __init__(self) -> None:
        self.sets = {p.name: FaultSet(p.name, p.rate_limited) for p in parts()}
        for faults in self.sets.values():
            faults.reset()
        self.unhang = asyncio.Event()
        """Set when ``hang`` is cleared (or the server stops) to release hanging requests."""

    def __getattr__(self, name: str) -> FaultSet:
        try:
            return self.__dict__["sets"][name]  # type: ignore[no-any-return]
        except KeyError:
            raise AttributeError(name) from None

    def for_provider(self, provider: str) -> FaultSet:
        return self.sets[provider]

    def _targets(self, provider: FaultTarget) -> list[FaultSet]:
        if provider == "all":
            return list(self.sets.values())
        if provider not in self.sets:
            raise ValueError(f"provider must be {spelled((*names(), 'all'))}")
        return [self.for_provider(provider)]

    def set(self, provider: FaultTarget = "all", **faults: Any) -> None:
        """Switch faults on (or off: ``hang=False``, ``rate_limit=False``, ``latency=0``)."""
        unknown = set(faults) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {list(FIELDS)}")
        for target in self._targets(provider):
            for name, value in faults.items():
                if name == "status_burst":
                    if value is None:
                        target.status_burst = None
                    else:
                        status, count = value
                        target.status_burst = (int(status), int(count)) if count else None
                elif name in ("hang", "rate_limit"):
                    setattr(target, name, bool(value))
                elif name == "attestation":
                    target.attestation = _attestation_fault(target.provider, value)
                elif name == "latency":
                    target.latency = float(value)
                else:
                    setattr(target, name, int(value))
        self._release_if_unhung()

    def clear(self, provider: FaultTarget = "all") -> None:
        """Back to defaults (no faults; Azure rate limit on), releasing hanging requests."""
        for target in self._targets(provider):
            target.reset()
        self._release_if_unhung()

    def _release_if_unhung(self) -> None:
        # hanging requests re-check their provider's flag when woken
        event, self.unhang = self.unhang, asyncio.Event()
        event.set()

    def snapshot(self) -> dict[str, Any]:
        return {name: faults.as_dict() for name, faults in self.sets.items()}
