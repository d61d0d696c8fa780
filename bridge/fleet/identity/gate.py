"""The per-source identity check: the credential of a request (or a bus message), then the
binding of each event to the instance it names. Sources call `IdentityGate.check` before
handing events to the store; what it refuses goes to the `rejected` table with its reason.

`required`: no credential or a bad one is 401, an event about another VM is 403.
`optional`: events without a credential pass as unattested (a fleet migrating sidecar by
sidecar); a credential present must verify and bind, as under `required`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bridge.fleet.store import Accepted

from .binding import mismatch
from .config import IdentityMode
from .credential import Credentials
from .model import AttestationError, Attested


@dataclass(frozen=True, slots=True)
class Verdict:
    """What `check` decided: `status` 0 when every event may be stored; else 401 (all
    refused, `refused` holds every index) or 403 (the indices about another VM)."""

    status: int = 0
    reason: str = ""
    refused: tuple[int, ...] = ()
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
                401, "credential", "no credential: enroll at POST /v1/enroll", range(len(events))
            )
        try:
            attested = self._credentials.check(credential, at)
        except AttestationError as exc:
            return self._refuse(401, "credential", exc.reason, range(len(events)))
        foreign = [
            (i, why)
            for i, a in enumerate(events)
            if (why := mismatch(attested, a.event)) is not None
        ]
        if foreign:
            return self._refuse(403, "binding", foreign[0][1], (i for i, _ in foreign), attested)
        self.counts[(self._source, "attested")] += len(events)
        return Verdict(attested=attested)

    def _refuse(
        self,
        status: int,
        kind: str,
        reason: str,
        indices: Iterable[int],
        attested: Attested | None = None,
    ) -> Verdict:
        refused = tuple(indices)
        self.counts[(self._source, f"refused_{kind}")] += len(refused)
        return Verdict(status, reason, refused, attested)
