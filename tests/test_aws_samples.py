"""AWS's own documentation examples (tests/fixtures/aws, sources in its README) parse into the
expected notices, and every such notice is valid against schema v1.

The watcher's mapping is driven directly with the bodies (no HTTP): what is under test is
that the vendor's documented shapes, times and codes become the right notices.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from bridge.infra.timeparse import parse_optional_time
from bridge.pipeline.events import to_cloudevent
from bridge.pipeline.model import Kind, Status
from bridge.providers.aws import imds
from bridge.providers.aws.settings import AwsSource
from bridge.providers.aws.watcher import AwsWatcher, instance_of, new_client
from tests.support import assert_valid

SAMPLES = Path(__file__).parent / "fixtures" / "aws"
IDENTITY = {
    "accountId": "123456789012",
    "availabilityZone": "us-east-1a",
    "instanceId": "i-1234567890abcdef0",
    "instanceType": "m5.large",
    "region": "us-east-1",
}
NOW = datetime(2019, 1, 21, 8, 0, tzinfo=UTC)


def body(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


@pytest.fixture
async def watcher() -> AwsWatcher:
    config = AwsSource()
    result = AwsWatcher(new_client(config), config, clock=lambda: NOW)
    result.instance = instance_of(IDENTITY)
    return result


async def test_the_spot_instance_action_example_is_a_started_preemption(
    watcher: AwsWatcher,
) -> None:
    (notice,) = watcher.diff_spot(imds.parse_instance_action(body("spot-instance-action.json")))
    assert (notice.kind, notice.status) == (Kind.PREEMPT, Status.STARTED)
    assert notice.not_before == datetime(2017, 9, 18, 8, 22, tzinfo=UTC)
    assert notice.raw == {"action": "stop", "time": "2017-09-18T08:22:00Z"}
    assert notice.description == "Spot interruption: the instance will stop"
    assert_valid(to_cloudevent(notice))


async def test_the_rebalance_example_is_a_scheduled_preemption_without_a_time(
    watcher: AwsWatcher,
) -> None:
    recommendation = imds.parse_rebalance(body("rebalance-recommendation.json"))
    (notice,) = watcher.diff_rebalance(recommendation)
    assert (notice.kind, notice.status, notice.not_before) == (
        Kind.PREEMPT,
        Status.SCHEDULED,
        None,
    )
    assert notice.raw == {"noticeTime": "2020-10-27T08:22:00Z"}
    assert_valid(to_cloudevent(notice))


async def test_the_scheduled_events_example_is_a_scheduled_reboot_with_its_window(
    watcher: AwsWatcher,
) -> None:
    (notice,) = watcher.diff_scheduled(imds.parse_scheduled(body("scheduled-events.json")), None)
    assert (notice.kind, notice.status) == (Kind.REBOOT, Status.SCHEDULED)
    assert notice.notice_id == "instance-event-0d59937288b749b32"
    assert notice.not_before == datetime(2019, 1, 21, 9, 0, 43, tzinfo=UTC)
    assert notice.window is not None
    assert notice.window.end == datetime(2019, 1, 21, 9, 17, 23, tzinfo=UTC)
    assert notice.window.latest_start is None
    assert notice.can_reschedule is False  # no NotBeforeDeadline
    assert notice.description == "scheduled reboot"
    data = assert_valid(to_cloudevent(notice))["data"]
    assert data["not_before"] == "2019-01-21T09:00:43Z"
    assert data["provider"] == "aws"


async def test_the_history_example_completes_the_scheduled_example(
    watcher: AwsWatcher,
) -> None:
    watcher.diff_scheduled(imds.parse_scheduled(body("scheduled-events.json")), None)
    history = imds.parse_scheduled(body("scheduled-events-history.json"))
    (notice,) = watcher.diff_scheduled([], history)
    assert (notice.kind, notice.status) == (Kind.REBOOT, Status.COMPLETED)
    assert notice.notice_id == "instance-event-0d59937288b749b32"
    assert notice.description == "[Completed] scheduled reboot"
    assert_valid(to_cloudevent(notice))


async def test_the_lifecycle_example_is_in_service_and_announces_nothing(
    watcher: AwsWatcher,
) -> None:
    state = imds.parse_lifecycle(body("target-lifecycle-state.txt"))
    assert state == "InService"
    assert watcher.diff_lifecycle(state) == []
    (notice,) = watcher.diff_lifecycle("Terminated")
    assert (notice.kind, notice.status) == (Kind.DELETE, Status.STARTED)


def test_the_event_time_format_parses_with_and_without_a_leading_zero() -> None:
    assert parse_optional_time("21 Jan 2019 09:00:43 GMT") == datetime(
        2019, 1, 21, 9, 0, 43, tzinfo=UTC
    )
    assert parse_optional_time("2 Dec 2026 13:48:15 GMT") == datetime(
        2026, 12, 2, 13, 48, 15, tzinfo=UTC
    )
    assert parse_optional_time("") is None
    with pytest.raises(ValueError, match="not an RFC 3339 or RFC 1123 time"):
        parse_optional_time("next Tuesday")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b'{"action": "terminate"}', "expected a time string"),
        (b'{"time": "2017-09-18T08:22:00Z"}', "needs a string action"),
        (b'{"action": "stop", "time": "soon"}', "not an RFC 3339 or RFC 1123 time"),
        (b"<html>", "Expecting value"),
    ],
)
def test_malformed_instance_actions_are_refused(text: bytes, why: str) -> None:
    # A time without a zone is not among them: like every metadata time, it is read as UTC.
    with pytest.raises(ValueError, match=why):
        imds.parse_instance_action(text)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b'{"EventId": "x"}', "not a JSON array"),
        (b'[{"Code": "system-reboot", "State": "active"}]', "needs a string EventId"),
        (
            b'[{"EventId": "e", "State": "active", "NotBefore": "soon"}]',
            "not an RFC 3339 or RFC 1123 time",
        ),
    ],
)
def test_malformed_scheduled_events_are_refused(text: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        imds.parse_scheduled(text)


@pytest.mark.parametrize(
    ("region", "arn"),
    [
        ("us-east-1", "arn:aws:ec2:us-east-1:123456789012:instance/i-1234567890abcdef0"),
        ("cn-north-1", "arn:aws-cn:ec2:cn-north-1:123456789012:instance/i-1234567890abcdef0"),
        (
            "us-gov-west-1",
            "arn:aws-us-gov:ec2:us-gov-west-1:123456789012:instance/i-1234567890abcdef0",
        ),
    ],
)
def test_the_source_is_the_instance_arn_in_its_partition(region: str, arn: str) -> None:
    instance = instance_of(IDENTITY | {"region": region})
    assert (instance.source, instance.name, instance.account) == (
        arn,
        "i-1234567890abcdef0",
        "123456789012",
    )
