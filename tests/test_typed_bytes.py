"""What the actions and the status API write did not change when they began to read typed
events (`bridge.contract.Event`) instead of dicts.

`tests/fixtures/typed/before.json` was written by the dict-based code (the commit before the
switch), from the events of `tests/typed_samples.py` (every provider; a window, fractions of
a second, non-ASCII text, a vendor `raw` object). These are user-facing contracts: a hook's
stdin and `MB_*` environment, the audit events' bytes (ids, attribute order, field order,
fields omitted when unset, escapes), the planned actions the spool keeps across versions, and
the `/v1/notices` and `/v1/eligible` bodies. Each must come out byte for byte the same.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from bridge import contract
from bridge.actions import audit, hooks
from bridge.actions.coordination.budget import Grant, Released
from bridge.actions.engine import Actions
from bridge.eligibility import eligibility
from bridge.pipeline.events import schema, serialize, to_cloudevent
from bridge.pipeline.in_force import InForce
from bridge.pipeline.spool import Spool
from bridge.pipeline.typed_events import encode, maintenance
from bridge.surface import status_api
from tests.typed_samples import AT, FRACTION, NOTICES, actions_config

BEFORE: dict[str, Any] = json.loads(
    (Path(__file__).parent / "fixtures" / "typed" / "before.json").read_text(encoding="utf-8")
)
#: The events as the sidecar wrote them when the fixture was made: before the additive
#: `traceparent` attribute (issue 35), as events spooled by an older version still are.
EVENTS = [
    msgspec.structs.replace(
        contract.from_cloudevent(serialize(to_cloudevent(notice))), traceparent=None
    )
    for notice in NOTICES
]
CONFIG = actions_config()

GRANTS = (
    None,
    Grant("acquired", "scale-set:sub/rg/web", "web_2", 1.23456, FRACTION, "slot-1"),
    Grant("timed-out", "zone:eu-west-1a", "i-0", 30.0),
)
RUNS = (
    audit.HookOutcome("drain", "succeeded", 0, 1.5, "drained\n"),
    audit.HookOutcome("checkpoint", "failed", 3, 0.1234567, "é✓ " * 2000, "exited with status 3"),
    audit.HookOutcome("drain", "timed-out", None, 60.0, "", "timed out"),
)


def _audit_events() -> list[contract.Event]:
    """The same audit events, in the same order, as the fixture's."""
    built = []
    for event in EVENTS:
        trigger = audit.Trigger.of(event)
        for run, grant in zip(RUNS, GRANTS, strict=True):
            budget = None if grant is None else grant.as_data()
            built.append(audit.hook_completed(trigger, run, AT, budget=budget))
            built.append(
                audit.approved(
                    trigger,
                    approved_by=maintenance(event).instance.name,
                    rule="preset vendor-sample[1]",
                    leader="self",
                    at=AT + timedelta(seconds=7),
                    budget=budget,
                )
            )
        released = Released(
            "zone:x", "web_2", "slot-2", FRACTION, FRACTION + timedelta(seconds=42.5)
        )
        built.append(audit.budget_released(trigger, released.as_data(), AT))
    return built


def test_a_hook_reads_the_same_bytes_on_stdin() -> None:
    assert [hooks.stdin_body(event).decode() for event in EVENTS] == BEFORE["stdin"]


def test_a_hook_gets_the_same_environment_and_matches_the_same_events() -> None:
    seen = []
    for event in EVENTS:
        data = maintenance(event)
        for hook in CONFIG.hooks:
            due = hooks.deadline(hook, data)
            seen.append([hooks.matches(hook, data), hooks.environment(hook, event, due, base={})])
    assert seen == BEFORE["env"]


def test_audit_events_keep_their_bytes() -> None:
    assert [encode(event).decode() for event in _audit_events()] == BEFORE["audit"]


@pytest.mark.parametrize("index", range(len(BEFORE["audit"])))
def test_every_audit_event_is_valid_and_reads_back_as_what_was_built(index: int) -> None:
    event = _audit_events()[index]
    body = encode(event)
    jsonschema.validate(json.loads(body), schema())
    assert contract.from_cloudevent(body) == event


async def test_the_planned_actions_are_stored_as_before(tmp_path: Path) -> None:
    async def approve(_notice_id: str) -> None:
        raise AssertionError("planning sends nothing")

    actions = Actions(CONFIG, Spool(tmp_path, []), approve, lambda _source, _id: False)
    assert actions.plan(EVENTS) == BEFORE["plan"]


def test_the_status_api_answers_as_before() -> None:
    in_force = InForce()
    for event in EVENTS:
        in_force.remember("watcher", event)
    current = sorted(in_force.events(), key=lambda event: event.time)
    ended = maintenance(EVENTS[-1])
    assert ended.status == "completed"  # the AWS notice ended; the other four are in force
    notices = json.loads(BEFORE["notices"])
    before = [e for e in notices if e["data"]["notice_id"] != ended.notice_id]
    assert len(current) == len(before) == 4
    assert json.loads(status_api.notices_body(current)) == before
    every = sorted(EVENTS[:5], key=lambda event: event.time)
    assert status_api.notices_body(every).decode() == BEFORE["notices"]
    answers = [eligibility(every, AT, h)[1] for h in (0.0, 60.0, 3600.0, 1e9)]
    assert json.loads(json.dumps(answers)) == [body for _ok, body in BEFORE["eligible"]]
    assert [eligibility(every, AT, h)[0] for h in (0.0, 60.0, 3600.0, 1e9)] == [
        ok for ok, _body in BEFORE["eligible"]
    ]


def test_the_notices_in_force_come_back_typed_from_the_spool_and_skip_what_is_unreadable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    in_force = InForce()
    spooled = {f"azure\t{maintenance(e).notice_id}": encode(e) for e in EVENTS[1:3]}
    spooled["azure\tbroken"] = b'{"not": "an event"}'
    in_force.restore(spooled)
    assert in_force.events() == EVENTS[1:3]
    assert in_force.is_scheduled(EVENTS[1].source, maintenance(EVENTS[1]).notice_id)
    assert not in_force.is_scheduled(EVENTS[2].source, maintenance(EVENTS[2]).notice_id)
    assert "broken of azure in force is unreadable" in caplog.text


async def test_a_planned_action_that_does_not_read_back_is_logged_not_a_crash_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def approve(_notice_id: str) -> None:
        raise AssertionError("nothing is approved here")

    spool = Spool(tmp_path, [])
    await spool.open()
    try:
        good = Actions(CONFIG, spool, approve, lambda _source, _id: False)
        plan = {
            key: detail for key, detail in good.plan(EVENTS).items() if key.startswith("approve")
        }
        broken = {"hook\tsomewhere\tn1\tscheduled\tdrain": '{"action": "hook", "event": {}}'}
        await spool.commit([], plan=plan | broken, states=dict.fromkeys(plan, "held"))
        actions = Actions(CONFIG, spool, approve, lambda _source, _id: False)
        await actions.start()  # does not raise: the broken row is logged and left planned
        await actions.stop(1.0)
        assert "planned action hook somewhere n1 scheduled drain is unreadable" in caplog.text
        assert await spool.action_state(next(iter(broken))) == "planned"
    finally:
        await spool.close()


def test_a_traceparent_reaches_a_hook_and_the_status_api_after_dataschema() -> None:
    """Events written now carry the CloudEvents distributed-tracing extension; a hook's stdin
    and the status API show it where the writer put it, the rest unchanged."""
    traced = [contract.from_cloudevent(serialize(to_cloudevent(notice))) for notice in NOTICES]
    for event, before in zip(traced, EVENTS, strict=True):
        assert event.traceparent is not None
        written = json.loads(hooks.stdin_body(event))
        assert list(written)[list(written).index("dataschema") + 1] == "traceparent"
        assert written.pop("traceparent") == event.traceparent
        assert written == json.loads(hooks.stdin_body(before))
    (first, *_) = json.loads(status_api.notices_body(traced[:1]))
    assert first["traceparent"] == traced[0].traceparent
