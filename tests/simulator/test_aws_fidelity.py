"""The simulated EC2 IMDS follows the vendor's documented rules and the shapes and defaults of
aws/amazon-ec2-metadata-mock, seen through a plain HTTP client (httpx)."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import requests

from bridge.simulator import Simulator, SimulatorThread, load_scenario

from .test_threaded_and_cli import _start_cli

TTL = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN = "X-aws-ec2-metadata-token"
SPOT = "latest/meta-data/spot/instance-action"


@pytest.fixture
async def aws() -> AsyncIterator[Simulator]:
    async with Simulator(provider="aws") as sim:
        yield sim


async def token(client: httpx.AsyncClient, sim: Simulator, ttl: str = "21600") -> str:
    response = await client.put(sim.aws_url + "latest/api/token", headers={TTL: ttl})
    assert response.status_code == 200
    assert response.headers[TTL] == ttl
    return response.text


@pytest.mark.parametrize("ttl", [None, "0", "21601", "-5", "six hours"])
async def test_a_token_ttl_outside_1_to_21600_is_a_400(
    aws: Simulator, client: httpx.AsyncClient, ttl: str | None
) -> None:
    headers = {} if ttl is None else {TTL: ttl}
    response = await client.put(aws.aws_url + "latest/api/token", headers=headers)
    assert response.status_code == 400
    assert "400 - Bad Request" in response.text


async def test_a_token_put_through_a_proxy_is_refused(
    aws: Simulator, client: httpx.AsyncClient
) -> None:
    response = await client.put(
        aws.aws_url + "latest/api/token", headers={TTL: "60", "X-Forwarded-For": "10.0.0.1"}
    )
    assert response.status_code == 403
    assert aws.aws.tokens == {}


async def test_the_token_path_takes_only_put(aws: Simulator, client: httpx.AsyncClient) -> None:
    response = await client.get(aws.aws_url + "latest/api/token", headers={TTL: "60"})
    assert response.status_code == 405


async def test_v1_is_allowed_by_default_as_in_the_mock(
    aws: Simulator, client: httpx.AsyncClient
) -> None:
    response = await client.get(aws.aws_url + "latest/meta-data/instance-id")
    assert (response.status_code, response.text) == (200, "i-1234567890abcdef0")
    assert response.headers["Server"] == "EC2ws"


async def test_when_v2_is_required_a_missing_token_is_a_401(
    aws: Simulator, client: httpx.AsyncClient
) -> None:
    aws.aws.quirks.v2_required = True
    response = await client.get(aws.aws_url + "latest/meta-data/instance-id")
    assert response.status_code == 401
    given = await token(client, aws)
    response = await client.get(
        aws.aws_url + "latest/meta-data/instance-id", headers={TOKEN: given}
    )
    assert response.status_code == 200


async def test_an_unknown_or_expired_token_is_a_401_even_with_v1_allowed(
    aws: Simulator, client: httpx.AsyncClient
) -> None:
    url = aws.aws_url + "latest/meta-data/instance-id"
    assert (await client.get(url, headers={TOKEN: "forged"})).status_code == 401
    given = await token(client, aws, ttl="60")
    assert (await client.get(url, headers={TOKEN: given})).status_code == 200
    aws.clock.advance(60)  # the TTL runs on the simulated clock
    assert (await client.get(url, headers={TOKEN: given})).status_code == 401


async def test_notices_are_404_until_they_exist(aws: Simulator, client: httpx.AsyncClient) -> None:
    for path in (SPOT, "latest/meta-data/events/recommendations/rebalance"):
        response = await client.get(aws.aws_url + path)
        assert response.status_code == 404
        assert "404 - Not Found" in response.text
    scheduled = await client.get(aws.aws_url + "latest/meta-data/events/maintenance/scheduled")
    assert (scheduled.status_code, json.loads(scheduled.text)) == (200, [])


async def test_spot_interruption_is_two_minutes_ahead_and_fixed(
    aws: Simulator, client: httpx.AsyncClient
) -> None:
    before = datetime.now(UTC)
    aws.aws.interrupt("hibernate")
    first = json.loads((await client.get(aws.aws_url + SPOT)).text)
    second = json.loads((await client.get(aws.aws_url + SPOT)).text)
    assert first == second
    assert first["action"] == "hibernate"
    when = datetime.fromisoformat(first["time"])
    assert timedelta(seconds=110) < when - before < timedelta(seconds=125)
    termination = await client.get(aws.aws_url + "latest/meta-data/spot/termination-time")
    assert termination.text == first["time"]


async def test_scheduled_events_and_their_history(
    aws: Simulator, client: httpx.AsyncClient
) -> None:
    event_id = aws.aws.add_event()  # the mock's defaults
    url = aws.aws_url + "latest/meta-data/events/maintenance/"
    (event,) = json.loads((await client.get(url + "scheduled")).text)
    assert list(event) == [
        "NotBefore",
        "Code",
        "Description",
        "EventId",
        "NotAfter",
        "State",
        "NotBeforeDeadline",
    ]
    assert (event["Code"], event["State"], event["EventId"]) == (
        "system-reboot",
        "active",
        event_id,
    )
    not_before = datetime.strptime(event["NotBefore"], "%d %b %Y %H:%M:%S GMT")
    not_after = datetime.strptime(event["NotAfter"], "%d %b %Y %H:%M:%S GMT")
    deadline = datetime.strptime(event["NotBeforeDeadline"], "%d %b %Y %H:%M:%S GMT")
    assert (not_after - not_before, deadline - not_before) == (timedelta(7), timedelta(9))
    aws.aws.cancel_event(event_id)
    assert json.loads((await client.get(url + "scheduled")).text) == []
    (past,) = json.loads((await client.get(url + "history")).text)
    assert (past["EventId"], past["State"]) == (event_id, "canceled")
    assert past["Description"].startswith("[Canceled]")


async def test_the_identity_document(aws: Simulator, client: httpx.AsyncClient) -> None:
    response = await client.get(aws.aws_url + "latest/dynamic/instance-identity/document")
    document = json.loads(response.text)
    assert {k: document[k] for k in ("instanceId", "region", "accountId", "instanceType")} == {
        "instanceId": "i-1234567890abcdef0",
        "region": "us-east-1",
        "accountId": "123456789012",
        "instanceType": "m4.xlarge",
    }


async def test_the_lifecycle_state_starts_in_service(
    aws: Simulator, client: httpx.AsyncClient
) -> None:
    url = aws.aws_url + "latest/meta-data/autoscaling/target-lifecycle-state"
    assert (await client.get(url)).text == "InService"
    aws.aws.set_lifecycle(None)
    assert (await client.get(url)).status_code == 404


async def test_faults_apply_to_aws(aws: Simulator, client: httpx.AsyncClient) -> None:
    aws.faults.set(provider="aws", status_burst=(503, 1))
    assert (await client.get(aws.aws_url + SPOT)).status_code == 503
    assert (await client.get(aws.aws_url + SPOT)).status_code == 404


async def test_the_control_api_drives_aws(aws: Simulator, client: httpx.AsyncClient) -> None:
    base = aws.base_url + "/_sim/aws"
    spot = await client.post(base + "/spot", json={"action": "stop", "time_in": 30})
    assert spot.json()["action"] == "stop"
    added = await client.post(base + "/events", json={"code": "instance-stop"})
    event_id = added.json()["EventId"]
    await client.post(f"{base}/events/{event_id}/complete")
    await client.post(base + "/lifecycle", json={"state": "Terminated"})
    state = (await client.get(base)).json()
    assert state["spot"]["action"] == "stop"
    assert state["history"][0]["State"] == "completed"
    assert state["lifecycle"] == "Terminated"
    assert (await client.post(base + "/events", json={"code": "nope"})).status_code == 400
    assert (await client.post(base + "/events/instance-event-x/cancel")).status_code == 404
    quirks = await client.post(aws.base_url + "/_sim/quirks", json={"aws": {"v2_required": True}})
    assert quirks.json()["aws"]["v2_required"] is True


async def test_scenarios_play_their_timelines() -> None:
    async with Simulator(provider="aws", scenario="aws-rebalance-then-interruption") as sim:
        sim.clock.advance(5)
        assert sim.aws.rebalance is not None
        assert sim.aws.spot is None
        sim.clock.advance(295)
        assert sim.aws.spot is not None
        assert sim.aws.spot["action"] == "terminate"
    scenario = load_scenario("aws-scheduled-reboot")
    async with Simulator(provider="aws", scenario=scenario) as sim:
        sim.clock.advance(5)
        assert [e["Code"] for e in sim.aws.scheduled()] == ["system-reboot"]
        sim.clock.advance(scenario.duration)
        assert sim.aws.scheduled() == []
        assert [e["State"] for e in sim.aws.past()] == ["completed"]


def test_the_thread_proxies_aws() -> None:
    with SimulatorThread(provider="aws") as sim:
        sim.aws.quirks.v2_required = True
        assert sim.aws.quirks.v2_required is True
        sim.aws.interrupt("stop")
        answer = requests.get(sim.aws_url + SPOT, timeout=5)
        assert answer.status_code == 401  # IMDSv2 required, no token
        assert sim.aws.spot is not None
        assert sim.aws.spot["action"] == "stop"


def test_the_cli_serves_aws_and_prints_where() -> None:
    proc = _start_cli("--port", "0", "--provider", "aws", "--scenario", "aws-asg-scale-in")
    try:
        assert proc.stdout is not None
        text = "".join(proc.stdout.readline() for _ in range(5))
        assert "AWS IMDS" in text
        assert "source.aws.imds_url = http://127.0.0.1:" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
