"""The bytes the sidecar writes, pinned by golden files: every event is written by one
encoder (`bridge.contract.encode`), and what a hook, a sink or the status API gets does not
change unnoticed.

`tests/fixtures/typed/golden.json` holds them for the events of `tests/typed_samples.py`
(every provider; a window, fractions of a second, non-ASCII text, a vendor `raw` object):
the maintenance events as spooled, the audit events and the heartbeats (ids, attribute
order, field order, fields omitted when unset, escapes), a hook's stdin and `MB_*`
environment, the planned actions the spool keeps across versions, and the `/v1/notices` and
`/v1/eligible` bodies. The stdin, environment, plan and eligibility entries were written by
the dict-based code before the events became typed; the events', audit events', heartbeats'
and `/v1/notices` bytes changed once, when one encoder replaced three (spacing and key order
only; CHANGELOG.md), and are pinned from then on. The one other change is additive: the
`traceparent` attribute (issue 35) after `dataschema`, on the maintenance events (and so in
a hook's stdin, the plan and `/v1/notices`), then on the audit events and heartbeats; an
event written before it is still written without it. Each must come out byte for byte the
same.
"""

from __future__ import annotations

import json
from datetime import timedelta, timezone
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from bridge import contract
from bridge.actions import audit, hooks
from bridge.actions.coordination.budget import Grant, Released
from bridge.actions.engine import Actions
from bridge.contract import encode
from bridge.eligibility import eligibility
from bridge.pipeline.events import parse, schema, serialize, to_cloudevent, to_event
from bridge.pipeline.heartbeat import heartbeat_event
from bridge.pipeline.in_force import InForce
from bridge.pipeline.spool import Spool
from bridge.pipeline.typed_events import maintenance
from bridge.surface import status_api
from tests.factories import GCE_VM
from tests.typed_samples import AT, AWS_VM, AZURE_VM, FRACTION, NOTICES, actions_config

BEFORE: dict[str, Any] = json.loads(
    (Path(__file__).parent / "fixtures" / "typed" / "golden.json").read_text(encoding="utf-8")
)
EVENTS = [contract.from_cloudevent(encode(to_event(notice))) for notice in NOTICES]
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


def _heartbeats() -> list[contract.Event]:
    """A heartbeat of each provider's VM (of version 0.2.0: the build's own names a commit)."""
    built = []
    for n, vm in enumerate((GCE_VM, AZURE_VM, AWS_VM)):
        event = heartbeat_event(
            vm,
            sequence=n,
            started_at=FRACTION,
            interval=60.0,
            watcher_healthy=bool(n % 2),
            spool_depth=n,
            at=AT,
        )
        data = msgspec.structs.replace(event.data, agent_version="0.2.0")
        built.append(msgspec.structs.replace(event, data=data))
    return built


def test_maintenance_events_keep_their_bytes() -> None:
    assert [encode(to_event(notice)).decode() for notice in NOTICES] == BEFORE["events"]


def test_heartbeats_keep_their_bytes() -> None:
    assert [encode(event).decode() for event in _heartbeats()] == BEFORE["heartbeats"]


def test_every_writer_of_an_event_writes_the_encoders_bytes() -> None:
    """One JSON form everywhere: a hook's stdin, the SDK object a sink is handed (read back
    from the spooled bytes, or built by `to_cloudevent`) and the status API's array all carry
    `contract.encode`'s bytes."""
    for event in [*EVENTS, *_audit_events(), *_heartbeats()]:
        body = encode(event)
        assert hooks.stdin_body(event) == body + b"\n"
        assert serialize(parse(body)) == body
        assert json.loads(serialize(parse(body))) == contract.to_dict(event)
    for notice, event in zip(NOTICES, EVENTS, strict=True):
        assert serialize(to_cloudevent(notice)) == encode(event)
    assert status_api.notices_body(EVENTS) == b"[" + b",".join(map(encode, EVENTS)) + b"]\n"


@pytest.mark.parametrize(
    ("text", "interval"),
    [
        ("plain", 60.0),
        ('é✓ \U0001f600 \\xe9 \\\\U0001f600 \\" \\\\" "é\\', 1e-7),
        ("del \x7f", 1e-7),
        ("small", 1e-7),
        ("big", 1e16),
        ("x:1e", 2.5),
    ],
)
def test_the_encoder_writes_compact_json_escaped_as_the_standard_library_does(
    text: str, interval: float
) -> None:
    """Non-ASCII and DEL escaped as `json.dumps` does (backslashes and quotes in the text
    stay what they were), `time` in UTC, whatever the content; a float's exponent as msgspec
    writes it (`1e-7`) unless the event has such characters (then `1e-07`, the standard
    library's). The SDK object a sink is handed is written to the same bytes."""
    event = msgspec.structs.replace(
        _heartbeats()[0], subject=text, time=FRACTION.astimezone(timezone(timedelta(hours=2)))
    )
    event = msgspec.structs.replace(
        event, data=msgspec.structs.replace(event.data, interval_seconds=interval)
    )
    body = encode(event)
    expected = json.dumps(
        {**contract.to_dict(event), "time": "2026-11-21T12:01:30.250000Z"}, separators=(",", ":")
    )
    if text.isascii() and "\x7f" not in text:
        expected = expected.replace("1e-07", "1e-7").replace("1e+16", "1e16")
    assert body.decode() == expected
    assert contract.from_cloudevent(body) == msgspec.structs.replace(event, time=FRACTION)
    assert serialize(parse(body)) == body


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
    """Events written now (maintenance, audit, heartbeat) carry the CloudEvents
    distributed-tracing extension right after `dataschema`; an event written before it (no
    traceparent) is written without the attribute (not as null), the rest byte for byte the
    same."""
    for event in [*EVENTS, *_audit_events(), *_heartbeats()]:
        assert event.traceparent is not None
        written = json.loads(hooks.stdin_body(event))
        assert list(written)[list(written).index("dataschema") + 1] == "traceparent"
        assert written.pop("traceparent") == event.traceparent
        older = msgspec.structs.replace(event, traceparent=None)
        assert written == json.loads(hooks.stdin_body(older))
        added = f',"traceparent":"{event.traceparent}"'.encode()
        assert encode(older) == encode(event).replace(added, b"")
        assert contract.from_cloudevent(encode(older)) == older
    (first, *_) = json.loads(status_api.notices_body(EVENTS[:1]))
    assert first["traceparent"] == EVENTS[0].traceparent


def test_audit_events_and_heartbeats_carry_the_trace_of_what_they_are_about() -> None:
    """An audit event joins the trace of the maintenance it answers (the trace id its
    notice's events carry), with a span of its own; the heartbeats of one sidecar process
    share a trace, another process has another."""
    trace_of = {
        (e.source, maintenance(e).notice_id): str(e.traceparent).split("-")[1] for e in EVENTS
    }
    spans = set()
    for event in _audit_events():
        assert isinstance(event.data, contract.TriggerData)
        version, trace, span, flags = str(event.traceparent).split("-")
        assert (version, flags) == ("00", "01")
        assert trace == trace_of[(event.source, event.data.notice_id)]
        spans.add(span)
    assert len(spans) == len({event.id for event in _audit_events()})
    beats = [
        heartbeat_event(
            GCE_VM,
            sequence=n,
            started_at=started,
            interval=60.0,
            watcher_healthy=True,
            spool_depth=0,
            at=AT,
        )
        for started in (FRACTION, AT)
        for n in range(2)
    ]
    traces = [str(beat.traceparent).split("-")[1] for beat in beats]
    assert traces[0] == traces[1] != traces[2] == traces[3]
    assert len({str(beat.traceparent).split("-")[2] for beat in beats}) == 4
    for event in [*_audit_events(), *beats]:
        jsonschema.validate(json.loads(encode(event)), schema())
