"""AWS notices take part in what the bridge does with notices like the others: hooks filtered
by provider, the status API's `/v1/eligible`, and the metrics."""

from __future__ import annotations

from pathlib import Path

from bridge.actions.audit import APPROVED, HOOK_COMPLETED
from bridge.runner import ProviderName
from bridge.simulator import Simulator
from bridge.surface.health import HealthMonitor
from bridge.surface.metrics import render
from tests.support import running_bridge
from tests.test_hooks import RECORD, python_hook, records
from tests.test_status_api import get, status_client

AWS: tuple[ProviderName, ...] = ("aws",)


async def test_a_hook_for_aws_runs_for_the_spot_interruption(
    aws_sim: Simulator, tmp_path: Path
) -> None:
    out = tmp_path / "record.jsonl"
    hooks = [
        python_hook("aws-only", RECORD, str(out), providers=["aws"], statuses=["started"]),
        python_hook("gce-only", RECORD, str(tmp_path / "gce.jsonl"), providers=["gce"]),
    ]
    async with running_bridge(aws_sim, tmp_path, AWS, settings={"hooks": hooks}) as run:
        aws_sim.aws.interrupt("terminate")
        (completed,) = await run.sink.wait_for_type(HOOK_COMPLETED)  # schema-checked
    (seen,) = records(out)
    env = seen["env"]
    assert (env["MB_PROVIDER"], env["MB_KIND"], env["MB_STATUS"]) == ("aws", "preempt", "started")
    assert env["MB_INSTANCE"] == "i-1234567890abcdef0"
    assert env["MB_NOT_BEFORE"] == seen["event"]["data"]["not_before"]
    assert completed["data"]["provider"] == "aws"
    assert records(tmp_path / "gce.jsonl") == []


async def test_eligible_and_metrics_see_aws_notices(aws_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(aws_sim, tmp_path, AWS) as run, status_client(run.bridge) as client:
        assert (await get(client, "/v1/eligible"))[0] == 200
        aws_sim.aws.interrupt("stop")
        await run.wait_for(1)
        status, body = await get(client, "/v1/eligible")
        assert status == 503
        assert "preempt started" in body["reason"]
        monitor = HealthMonitor()
        monitor.attach(run.bridge)
        metrics = await render(monitor)
        aws_sim.aws.clear_spot()
        await run.wait_for(2)
        assert (await get(client, "/v1/eligible"))[0] == 200
    assert (
        'maintenance_bridge_notices_total{provider="aws",kind="preempt",status="started"} 1'
        in metrics
    )


async def test_approval_rules_never_act_on_aws_notices(aws_sim: Simulator, tmp_path: Path) -> None:
    settings = {"approval": {"leader": "self", "rules": [{"action": "approve"}]}}
    async with running_bridge(aws_sim, tmp_path, AWS, settings=settings) as run:
        aws_sim.aws.add_event(code="system-reboot", not_before_in=3600)
        (scheduled,) = await run.wait_for(1)
        assert (await run.settle()) == [scheduled]  # no approval event follows
    assert run.sink.of_type(APPROVED) == []
    assert [r.method for r in aws_sim.requests if r.method not in ("GET", "PUT")] == []
