"""The AWS watcher against the simulator's EC2 IMDS, through the real pipeline (spool,
dispatcher, schema-checking sink).

Every AWS row of the mapping table, the IMDSv2 session (token on every request, renewal
before expiry and after a 401), and the hostile inputs: 401 and 5xx storms, 429s, dropped
connections, malformed bodies. The simulator requires IMDSv2 here (`aws_sim`), so a request
without a valid token would fail.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bridge.providers.aws.watcher import AwsWatcher
from bridge.runner import ProviderName
from bridge.simulator import Simulator
from tests.support import Running, eventually, running_bridge

AWS: tuple[ProviderName, ...] = ("aws",)
TOKEN = "X-aws-ec2-metadata-token"


def watcher_of(run: Running) -> AwsWatcher:
    watcher = run.bridge.watchers["aws"]
    assert isinstance(watcher, AwsWatcher)
    return watcher


@pytest.mark.parametrize("action", ["terminate", "stop", "hibernate"])
async def test_spot_interruption_is_a_started_preemption(
    aws_sim: Simulator, tmp_path: Path, action: str
) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        await run.settle(0.3)
        notice = aws_sim.aws.interrupt(action)
        (started,) = await run.wait_for(1)
        assert (await run.settle()) == [started]
        aws_sim.aws.clear_spot()  # a stopped or hibernated instance is back
        await run.wait_for(2)
    assert run.sink.summary() == [("preempt", "started"), ("preempt", "completed")]
    data = started["data"]
    assert data["not_before"] == notice["time"]
    assert data["raw"] == {"action": action, "time": notice["time"]}
    assert action in data["description"]
    assert started["source"] == "arn:aws:ec2:us-east-1:123456789012:instance/i-1234567890abcdef0"
    assert started["subject"] == "i-1234567890abcdef0"
    assert data["instance"]["account"] == "123456789012"
    assert data["instance"]["instance_type"] == "m4.xlarge"
    assert data["instance"]["zone"] == "us-east-1f"


async def test_rebalance_recommendation_then_interruption(
    aws_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        aws_sim.aws.recommend_rebalance()
        (recommendation,) = await run.wait_for(1)
        aws_sim.aws.interrupt("terminate")
        events = await run.wait_for(3)
        assert (await run.settle()) == events
    assert run.sink.summary() == [
        ("preempt", "scheduled"),
        ("preempt", "started"),
        ("preempt", "completed"),
    ]
    assert recommendation["data"]["not_before"] is None
    # the recommendation is the notice that completes, superseded by the interruption
    assert events[2]["data"]["notice_id"] == recommendation["data"]["notice_id"]
    assert events[1]["data"]["notice_id"] != recommendation["data"]["notice_id"]


async def test_a_withdrawn_rebalance_recommendation_is_cancelled(
    aws_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        aws_sim.aws.recommend_rebalance()
        await run.wait_for(1)
        aws_sim.aws.clear_rebalance()
        await run.wait_for(2)
    assert run.sink.summary() == [("preempt", "scheduled"), ("preempt", "cancelled")]


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("instance-reboot", "reboot"),
        ("system-reboot", "reboot"),
        ("instance-stop", "terminate"),
        ("instance-retirement", "terminate"),
        ("system-maintenance", "unknown"),
    ],
)
async def test_scheduled_event_completed_per_history(
    aws_sim: Simulator, tmp_path: Path, code: str, kind: str
) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        event_id = aws_sim.aws.add_event(code=code, not_before_in=3600)
        (scheduled,) = await run.wait_for(1)
        aws_sim.aws.complete_event(event_id)
        events = await run.wait_for(2)
        assert (await run.settle()) == events
    assert run.sink.summary() == [(kind, "scheduled"), (kind, "completed")]
    assert {e["data"]["notice_id"] for e in events} == {event_id}
    data = scheduled["data"]
    assert data["origin"] == "platform"
    assert data["can_reschedule"] is True  # the simulator sets NotBeforeDeadline by default
    assert data["window"]["latest_start"] is not None
    assert events[1]["data"]["description"].startswith("[Completed]")


async def test_scheduled_event_cancelled_per_history(aws_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        event_id = aws_sim.aws.add_event(code="system-reboot", not_before_in=3600)
        await run.wait_for(1)
        aws_sim.aws.cancel_event(event_id)
        await run.wait_for(2)
    assert run.sink.summary() == [("reboot", "scheduled"), ("reboot", "cancelled")]


@pytest.mark.parametrize(("not_before_in", "status"), [(3600, "cancelled"), (-60, "completed")])
async def test_an_event_gone_without_history_ended_by_its_not_before(
    aws_sim: Simulator, tmp_path: Path, not_before_in: float, status: str
) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        event_id = aws_sim.aws.add_event(code="instance-stop", not_before_in=not_before_in)
        await run.wait_for(1)
        aws_sim.aws.remove_event(event_id)
        await run.wait_for(2)
    assert run.sink.summary() == [("terminate", "scheduled"), ("terminate", status)]


async def test_started_only_when_the_platform_says_so(aws_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        event_id = aws_sim.aws.add_event(code="system-reboot", not_before_in=-5)
        await run.wait_for(1)
        await run.settle()  # NotBefore has passed: still only scheduled
        assert run.sink.summary() == [("reboot", "scheduled")]
        aws_sim.aws.set_event_state(event_id, "in-progress")
        await run.wait_for(2)
        aws_sim.aws.complete_event(event_id)
        events = await run.wait_for(3)
        assert (await run.settle()) == events
    assert run.sink.summary() == [
        ("reboot", "scheduled"),
        ("reboot", "started"),
        ("reboot", "completed"),
    ]


async def test_a_moved_event_is_announced_again(aws_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        event_id = aws_sim.aws.add_event(code="system-reboot", not_before_in=3600)
        await run.wait_for(1)
        event = aws_sim.aws.find(event_id)
        assert event is not None
        event.not_before = "2 Dec 2033 13:48:15 GMT"  # rescheduled by the owner
        aws_sim.aws.notify()
        first, second = await run.wait_for(2)
        assert (await run.settle()) == [first, second]
    assert second["data"]["status"] == "scheduled"
    assert second["data"]["not_before"] == "2033-12-02T13:48:15Z"
    assert second["id"] != first["id"]


@pytest.mark.parametrize("state", ["Terminated", "Warmed:Terminated"])
async def test_auto_scaling_scale_in_is_a_started_deletion(
    aws_sim: Simulator, tmp_path: Path, state: str
) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        aws_sim.aws.set_lifecycle("Standby")
        await run.settle(0.5)
        assert run.sink.events == []  # Standby, Detached, InService: no notice
        aws_sim.aws.set_lifecycle(state)
        (started,) = await run.wait_for(1)
        assert (await run.settle()) == [started]
    assert run.sink.summary() == [("delete", "started")]
    assert started["data"]["raw"] == {"target-lifecycle-state": state}


async def test_every_request_carries_a_token_and_no_forwarding_header(
    aws_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        await run.settle(0.6)
        assert watcher_of(run).session.issued == 1
    puts = [r for r in aws_sim.requests if r.path == "/latest/api/token"]
    reads = [r for r in aws_sim.requests if r.path != "/latest/api/token"]
    assert [r.method for r in puts] == ["PUT"]
    assert puts[0].headers["X-aws-ec2-metadata-token-ttl-seconds"] == "21600"
    assert len(reads) >= 4
    assert all(r.headers.get(TOKEN) and r.status in (200, 404) for r in reads)
    assert not any("X-Forwarded-For" in r.headers for r in aws_sim.requests)


async def test_the_token_is_renewed_before_it_expires(aws_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS, aws={"token_ttl": 1}) as run:
        await eventually(lambda: "aws" in run.bridge.watchers)
        await eventually(lambda: watcher_of(run).session.issued >= 3)
        aws_sim.aws.interrupt("terminate")
        await run.wait_for(1)
    assert not any(r.status == 401 for r in aws_sim.requests)


async def test_token_expiry_mid_run_loses_nothing(aws_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        await run.settle(0.3)
        aws_sim.clock.advance(21600)  # every token issued so far is now past its TTL
        event_id = aws_sim.aws.add_event(code="instance-reboot", not_before_in=600)
        await run.wait_for(1)
        aws_sim.aws.expire_tokens()  # and once more, as an IMDS restart would
        aws_sim.aws.cancel_event(event_id)
        events = await run.wait_for(2)
        assert (await run.settle()) == events
        assert watcher_of(run).session.issued >= 3
    assert run.sink.summary() == [("reboot", "scheduled"), ("reboot", "cancelled")]
    assert any(r.status == 401 for r in aws_sim.requests)


@pytest.mark.parametrize("status", [401, 500, 503])
async def test_error_storms_lose_nothing(aws_sim: Simulator, tmp_path: Path, status: int) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        await run.settle(0.3)
        aws_sim.faults.set(provider="aws", status_burst=(status, 8), drop=2)
        aws_sim.aws.interrupt("terminate")
        await run.wait_for(1, timeout=30)
        aws_sim.aws.clear_spot()
        events = await run.wait_for(2, timeout=30)
        assert (await run.settle()) == events
        errors = watcher_of(run).stats.errors
    assert run.sink.summary() == [("preempt", "started"), ("preempt", "completed")]
    assert errors.get(str(status)) == 8


async def test_rate_limiting_is_honored(aws_sim: Simulator, tmp_path: Path) -> None:
    aws_sim.faults.set(provider="aws", rate_limit=True)  # 5 requests/s, then 429
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        aws_sim.aws.recommend_rebalance()
        await run.wait_for(1, timeout=20)
        await run.settle(1.0)
        assert watcher_of(run).stats.errors.get("429", 0) > 0
    assert run.sink.summary() == [("preempt", "scheduled")]


async def test_malformed_bodies_are_retried(aws_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        await run.settle(0.3)
        aws_sim.aws.interrupt("stop")
        aws_sim.faults.set(provider="aws", malformed=5)
        (event,) = await run.wait_for(1, timeout=20)
        assert (await run.settle()) == [event]
        assert watcher_of(run).stats.errors.get("malformed", 0) >= 1


async def test_restart_while_notices_are_under_way(aws_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        aws_sim.aws.interrupt("hibernate")
        event_id = aws_sim.aws.add_event(code="system-reboot", not_before_in=3600)
        aws_sim.aws.set_lifecycle("Terminated")
        first = await run.wait_for(3)
        assert sorted(run.sink.summary()) == [
            ("delete", "started"),
            ("preempt", "started"),
            ("reboot", "scheduled"),
        ]
    # while the bridge is down the event is cancelled; then it comes back
    aws_sim.aws.cancel_event(event_id)
    async with running_bridge(aws_sim, tmp_path, AWS) as again:
        (cancelled,) = await again.wait_for(1)
        assert (await again.settle()) == [cancelled]  # nothing announced twice
        aws_sim.aws.clear_spot()
        await again.wait_for(2)
    assert again.sink.summary() == [("reboot", "cancelled"), ("preempt", "completed")]
    ids = {e["id"] for e in first}
    assert not ids & {e["id"] for e in again.sink.dicts()}


async def test_redirects_are_refused_not_followed(aws_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        await run.settle(0.3)
        aws_sim.faults.set(provider="aws", redirect=3)
        aws_sim.aws.interrupt("terminate")
        await run.wait_for(1, timeout=20)
        assert watcher_of(run).stats.errors.get("redirect") == 3
    assert aws_sim.redirects_followed == 0


async def test_a_broken_scheduled_events_answer_does_not_hold_up_the_spot_notice(
    aws_sim: Simulator, tmp_path: Path
) -> None:
    event_id = aws_sim.aws.add_event(code="system-reboot", not_before_in=3600)
    event = aws_sim.aws.find(event_id)
    assert event is not None
    event.not_before = "sometime soon"  # IMDS serves an array the watcher cannot read
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        await run.settle(0.5)
        aws_sim.aws.interrupt("terminate")
        (started,) = await run.wait_for(1)
        assert watcher_of(run).stats.errors.get("malformed", 0) >= 2  # tried every poll
        event.not_before = "21 Jan 2033 09:00:43 GMT"  # readable again
        events = await run.wait_for(2)
        assert (await run.settle()) == events
    assert run.sink.summary() == [("preempt", "started"), ("reboot", "scheduled")]
    assert started["data"]["kind"] == "preempt"


async def test_a_token_put_that_times_out_is_named_and_retried(
    aws_sim: Simulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    aws_sim.aws.quirks.token_put_timeout = True  # the hop-limit symptom
    caplog.set_level(logging.WARNING, logger="bridge.watchers.aws")
    async with running_bridge(aws_sim, tmp_path, AWS, aws={"request_timeout": 0.3}) as run:
        await eventually(lambda: "hop limit must be 2" in caplog.text)
        aws_sim.aws.quirks.token_put_timeout = False  # the hop limit was raised
        aws_sim.aws.interrupt("terminate")
        await run.wait_for(1, timeout=20)
    assert caplog.text.count("hop limit must be 2") == 1
    reads = [r for r in aws_sim.requests if r.path != "/latest/api/token"]
    assert all(r.headers.get(TOKEN) for r in reads)  # never fell back to IMDSv1


async def test_a_changed_spot_notice_is_announced_again(aws_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run:
        aws_sim.aws.interrupt("stop", time_in=120)
        await run.wait_for(1)
        aws_sim.aws.interrupt("terminate", time_in=60)  # the platform changed its mind
        first, second = await run.wait_for(2)
        assert (await run.settle()) == [first, second]
    assert run.sink.summary() == [("preempt", "started"), ("preempt", "started")]
    assert second["data"]["notice_id"] == first["data"]["notice_id"]
    assert second["id"] != first["id"]
    assert second["data"]["raw"]["action"] == "terminate"
