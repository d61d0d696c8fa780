"""The per-source identity check: the credential of a request (or a bus message), then the
binding of each event to the instance it names. Sources call `IdentityGate.check` before
handing events to the store; what it refuses goes to the `rejected` table with its reason.

`required`: no credential or a bad one is 401, an event about another VM is 403.
`optional`: events without a credential pass as unattested (a fleet migrating sidecar by
sidecar); a credential present must verify and bind, as under `required`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from bridge.fleet.store import Accepted

from .binding import comparer, mismatch
from .config import IdentityMode
from .credential import Credentials
from .model import AttestationError, Attested


@dataclass(frozen=True, slots=True)
class Verdict:
    """What `check` decided: `status` 0 when every event may be stored; else 401 (all
    refused, for one reason) or 403 (only the events about another VM: the others, the
    enrolled VM's own, are stored as attested). `refused`: (index, reason) of each refused
    event, each with its own reason (two foreign events may differ in what does not match);
    `reason` is the first's."""

    status: int = 0
    reason: str = ""
    refused: tuple[tuple[int, str], ...] = ()
    attested: Attested | None = None


PASS = Verdict()


class IdentityGate:
    def __init__(
        self,
        mode: IdentityMode,
        credentials: Credentials | None,
        source: str = "",
        counts: Counter[tuple[str, str]] | None = None,
    ) -> None:
        if mode != "off" and credentials is None:
            raise ValueError(f'identity = "{mode}" needs a [fleet.identity] table')
        self.mode = mode
        self._credentials = credentials
        self._source = source
        #: (source, outcome) -> events: `fleet_identity_events_total` (IngestStats.identity).
        #: Per instance, the store keeps whether its latest events were attested
        #: (`Batch.attested`, from `bridge.fleet.identity.screen`).
        self.counts: Counter[tuple[str, str]] = Counter() if counts is None else counts
        self._attested = (source, "attested")  # the key counted on every event that passes

    def check(
        self, credential: str | None, events: Sequence[Accepted], at: float | None = None
    ) -> Verdict:
        """`at`: when a bus took the message carrying `credential` (`Credentials.check`)."""
        if self.mode == "off" or self._credentials is None:
            return PASS
        if not credential:
            if self.mode == "optional":
                self.counts[(self._source, "unattested")] += len(events)
                return PASS
            return self._refuse(
                401, "credential", "no credential: enroll at POST /v1/enroll", len(events)
            )
        try:
            attested = self._credentials.check(credential, at)
        except AttestationError as exc:
            return self._refuse(401, "credential", exc.reason, len(events))
        same = comparer(attested.provider)
        foreign = [
            (i, why)
            for i, a in enumerate(events)
            if (why := mismatch(attested, a.event, same)) is not None
        ]
        self.counts[self._attested] += len(events) - len(foreign)
        if foreign:
            self.counts[(self._source, "refused_binding")] += len(foreign)
            return Verdict(403, foreign[0][1], tuple(foreign), attested)
        return Verdict(attested=attested)

    def _refuse(self, status: int, kind: str, reason: str, count: int) -> Verdict:
        """Every one of `count` events refused for `reason` (no or a bad credential)."""
        self.counts[(self._source, f"refused_{kind}")] += count
        return Verdict(status, reason, tuple((i, reason) for i in range(count)))
