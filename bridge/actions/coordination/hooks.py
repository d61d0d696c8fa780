"""What the budget means for a hook marked `budget = true` (no client code: imported by
bridge/actions/engine.py whether or not `[coordination]` is configured)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

import msgspec

from bridge import contract
from bridge.actions import hooks
from bridge.config import Hook

if TYPE_CHECKING:
    from bridge.actions.coordination.budget import Grant

log = logging.getLogger("bridge.coordination")


def last_useful_start(hook: Hook, data: contract.MaintenanceData) -> datetime | None:
    """Until when a budgeted hook waits for a slot: `timeout` seconds before its deadline
    (`deadline_before`, else not_before), so that `on_budget_timeout = "run"` still leaves
    it its whole time. None when the notice has no time (it waits while in force)."""
    due = hooks.deadline(hook, data) or hooks.deadline(
        msgspec.structs.replace(hook, deadline_before=0.0), data
    )
    return None if due is None else due - timedelta(seconds=hook.timeout)


def refusal(grant: Grant, on_budget_timeout: Literal["run", "skip"]) -> str | None:
    """Why the hook must not run after `grant` (it is reported `skipped`), or None."""
    if grant.may_act:
        return None
    if grant.outcome == "withdrawn":
        return f"the notice ended while it waited {grant.waited_seconds:.0f}s for a budget slot"
    if on_budget_timeout == "run":
        log.warning(
            "no budget slot of %s in time: running anyway (on_budget_timeout = run)", grant.group
        )
        return None
    return (
        f"no budget slot of {grant.group} free before its deadline "
        f"(waited {grant.waited_seconds:.0f}s; on_budget_timeout = skip)"
    )
