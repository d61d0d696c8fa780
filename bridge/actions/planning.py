"""Which actions a batch of new maintenance events calls for: the hooks whose filters
match, and an approval where the provider's plug-in approves events, a rule of `[approval]`
decides so and this VM is the group's leader.

What `plan` returns is committed (state `planned`) in the transaction that spools the
events, in the form `bridge.actions.planned` reads back.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Container, Mapping, Sequence

from bridge import contract
from bridge.actions import approval, hooks
from bridge.actions.planned import approval_key, hook_key
from bridge.config import Approval, Hook
from bridge.pipeline.typed_events import maintenance
from bridge.providers import plugins as providers

log = logging.getLogger("bridge.actions")


def plan(
    events: Sequence[contract.Event],
    configured: Mapping[str, Hook],
    policy: Approval,
    known: Container[str],
    *,
    budgeted: bool,
) -> dict[str, str]:
    """The new actions the maintenance `events` call for: key -> detail (the JSON
    `Planned.decode` reads back), in the order they run. `configured`: the hooks by display
    name; `known`: the keys planned before; `budgeted`: `[coordination]` is configured."""
    planned: dict[str, str] = {}
    for event in events:
        data = maintenance(event)
        names = [n for n, hook in configured.items() if hooks.matches(hook, data)]
        decision = approval_for(policy, data)
        if not names and decision is None:
            continue
        hook_keys = [hook_key(event, name) for name in names]
        seen = contract.to_dict(event)  # stored as consumers saw it (a hook's stdin, resumed)
        for key, name in zip(hook_keys, names, strict=True):
            if key not in known:
                detail: dict[str, object] = {"action": "hook", "hook": name, "event": seen}
                if configured[name].budget:
                    detail["budget"] = True
                planned[key] = json.dumps(detail)
        key = approval_key(event)
        if decision is not None and key not in known and key not in planned:
            planned[key] = json.dumps(
                {
                    "action": decision.action,
                    "rule": decision.rule,
                    "hooks": hook_keys,
                    "event": seen,
                    **({"budget": True} if budgeted else {}),
                }
            )
    return planned


def approval_for(policy: Approval, data: contract.MaintenanceData) -> approval.Decision | None:
    """The approval a Scheduled notice calls for, None when it calls for none here."""
    if not providers.get(data.provider).approves_events or data.status != "scheduled":
        return None
    if not isinstance(data.raw, dict):
        return None  # the vendor's object as received: an Azure event is a JSON object
    decision = approval.decide(policy, data.raw)
    if decision is None or decision.action == "never":
        return None
    if not approval.is_leader(policy, data.instance.name, data.affected):
        log.info(
            "not approving %s: %s (leader = %s) approves for the group",
            data.notice_id,
            min(data.affected, key=str.casefold),
            policy.leader,
        )
        return None
    return decision
