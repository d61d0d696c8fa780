"""A planned action as the spool keeps it: its key in the actions table, the JSON it is
stored as, and that JSON read back (`Planned`).

Planning writes this form in the transaction that spools the events, running reads it back,
and a start-up resumes from it, so one module holds it. The keys are what makes each action
happen at most once: a hook per transition and hook name, an approval per notice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from bridge import contract
from bridge.pipeline.spool import Action
from bridge.pipeline.typed_events import maintenance

log = logging.getLogger("bridge.actions")

ActionName = Literal["hook", "approve", "approve-after-hooks"]


def hook_key(event: contract.Event, hook_name: str) -> str:
    """The key of one hook's run on one transition of a notice."""
    data = maintenance(event)
    return "\t".join(("hook", event.source, data.notice_id, data.status, hook_name))


def approval_key(event: contract.Event) -> str:
    """The key of a notice's approval (one per notice, whatever the transition)."""
    return "\t".join(("approve", event.source, maintenance(event).notice_id))


def chain_of(event: contract.Event) -> str:
    """The notice `event` is about (source and notice id): its actions run one after
    another, and it holds at most one budget slot."""
    return "\t".join((event.source, maintenance(event).notice_id))


class _Stored(msgspec.Struct, frozen=True, kw_only=True):
    """A planned action as `plan` stores it in the spool's actions table (JSON, written with
    `json.dumps` in the key order `plan` gives; rows of earlier versions read the same)."""

    action: ActionName
    event: msgspec.Raw
    hook: str = ""  # action "hook": its name
    rule: str = ""  # approvals: the rule that decided
    hooks: list[str] = []  # approve-after-hooks: the keys of the hooks it waits for
    budget: bool = False  # the action takes a slot of the maintenance budget


@dataclass(frozen=True, slots=True)
class Planned:
    """A planned action, read back from the spool: its maintenance event decoded once."""

    action: ActionName
    event: contract.Event
    hook: str
    rule: str
    hooks: list[str]
    budget: bool

    @classmethod
    def decode(cls, detail: str | bytes) -> Planned:
        stored = msgspec.json.decode(detail, type=_Stored)
        return cls(
            action=stored.action,
            event=contract.from_cloudevent(bytes(stored.event)),
            hook=stored.hook,
            rule=stored.rule,
            hooks=stored.hooks,
            budget=stored.budget,
        )


def readable(rows: Sequence[Action]) -> list[tuple[Action, Planned]]:
    """The rows whose detail reads back. One that does not (it cannot: this code wrote it) is
    logged and left as it is, rather than stop every start-up of the bridge."""
    found = []
    for row in rows:
        try:
            found.append((row, Planned.decode(row.detail)))
        except (contract.ContractError, msgspec.DecodeError) as exc:
            key = row.key.replace("\t", " ")
            log.error("planned action %s is unreadable, left as it is: %s", key, exc)
    return found
