"""Azure approval policy: which Scheduled events this VM lets start early, and who approves.

Approving (POST `StartRequests`) tells Azure it may start the maintenance before `NotBefore`,
for *every* VM in the event's `Resources`. So two questions decide:

- The rules: matched in order against the event as IMDS gave it (`EventType`,
  `EventSource`, `DurationInSeconds`); the first match decides `approve` (at once),
  `approve-after-hooks` (once every hook that ran for this transition succeeded) or `never`.
  Explicit `[[approval.rules]]` come before the preset's. Nothing matches: never, the safe
  choice, because an unapproved event still starts by itself at `NotBefore`.
- The leader: only one VM of the group should approve, or the slowest VM's hooks would be
  cut short by the fastest VM's approval. `sorted-first` (default) lets the first name of
  `Resources` in sorted order (case-insensitively, as Azure names are) approve: every VM of
  the group computes the same answer from the same document, no coordination needed. `self`
  lets each VM approve for itself (for events that only list that VM, or when the
  application does not mind); `none` disables approval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from bridge.config import Approval, ApprovalAction, ApprovalRule

#: The policy of the vendor's Python sample (`advanced_sample`): approve every user-initiated
#: event, and freezes whose DurationInSeconds is known and below 9 seconds.
VENDOR_SAMPLE: Final = (
    ApprovalRule(sources=("User",), action="approve"),
    ApprovalRule(event_types=("Freeze",), min_duration=0, max_duration=8, action="approve"),
)
PRESETS: Final = {"vendor-sample": VENDOR_SAMPLE}


@dataclass(frozen=True, slots=True)
class Decision:
    action: ApprovalAction
    #: Which rule matched: `approval.rules[i]` or `preset vendor-sample[i]`.
    rule: str


def rules(config: Approval) -> list[tuple[str, ApprovalRule]]:
    """The rules in the order they are tried, each with the name audit events give it."""
    named = [(f"approval.rules[{i}]", rule) for i, rule in enumerate(config.rules)]
    if config.preset is not None:
        named += [(f"preset {config.preset}[{i}]", r) for i, r in enumerate(PRESETS[config.preset])]
    return named


def _duration(raw: Mapping[str, object]) -> int | None:
    value = raw.get("DurationInSeconds")
    return value if isinstance(value, int) and value >= 0 else None


def rule_matches(rule: ApprovalRule, raw: Mapping[str, object]) -> bool:
    """Whether `rule` applies to an Azure event object; a duration range never matches an
    unknown duration (-1 or missing)."""
    if rule.event_types and raw.get("EventType") not in rule.event_types:
        return False
    if rule.sources and raw.get("EventSource") not in rule.sources:
        return False
    if rule.min_duration is None and rule.max_duration is None:
        return True
    duration = _duration(raw)
    if duration is None:
        return False
    return (rule.min_duration is None or duration >= rule.min_duration) and (
        rule.max_duration is None or duration <= rule.max_duration
    )


def decide(config: Approval, raw: Mapping[str, object]) -> Decision | None:
    """The first matching rule's decision, or None (never approve)."""
    for name, rule in rules(config):
        if rule_matches(rule, raw):
            return Decision(rule.action, name)
    return None


def is_leader(config: Approval, me: str, affected: Sequence[str]) -> bool:
    """Whether this VM (`me`, its compute name) is the one that approves for the group."""
    if config.leader == "none":
        return False
    if config.leader == "self" or not affected:
        return True
    return min(affected, key=str.casefold).casefold() == me.casefold()
