"""The hook a source calls between parsing and the store: its identity gate applied to one
request's (or message's) events, the refused ones moved to the `rejected` list with the
reason, so the store keeps them and the source answers 401/403."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bridge.fleet.store import Accepted, Refused

from .gate import IdentityGate


@dataclass(frozen=True, slots=True)
class Screened:
    accepted: list[Accepted]
    refused: list[tuple[int, Refused]]
    #: 0, or 401/403 with its reason: what the source answers.
    status: int = 0
    reason: str = ""
    #: The kept events came with a verified credential (True), with none on an `optional`
    #: source (False), or identity is not checked here (None): `Batch.attested`.
    attested: bool | None = None


def screen(
    gate: IdentityGate | None,
    credential: str | None,
    accepted: Sequence[Accepted],
    refused: Sequence[tuple[int, Refused]],
    at: float | None = None,
) -> Screened:
    """`accepted` minus the events the gate refuses; `refused` plus those (with their index
    among all events of the request, as the contract's refusals have). `at`: when a bus
    took the message (its credential must have been valid then), None for now."""
    if gate is None or gate.mode == "off":
        return Screened(list(accepted), list(refused))
    verdict = gate.check(credential, accepted, at)
    attested = verdict.attested is not None
    if not verdict.status:
        return Screened(list(accepted), list(refused), attested=attested)
    taken = {index for index, _ in refused}
    positions = [i for i in range(len(accepted) + len(refused)) if i not in taken]
    out = dict(verdict.refused)
    kept = [event for i, event in enumerate(accepted) if i not in out]
    denied = [
        (positions[i], Refused(accepted[i].body, f"identity: {reason}"))
        for i, reason in verdict.refused
    ]
    merged = sorted([*refused, *denied], key=lambda item: item[0])
    return Screened(kept, merged, verdict.status, verdict.reason, attested)
