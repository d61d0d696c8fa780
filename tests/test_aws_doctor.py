"""AWS in `doctor` and in `provider = "auto"`: detection through IMDSv2, the token check, and
the classic failure (a token PUT that times out: the hop limit) explained with its fix.

`doctor` runs as a real process against the simulator's EC2 IMDS and a real webhook
receiver, as in tests/test_doctor.py (whose helpers these tests reuse).
"""

from __future__ import annotations

from pathlib import Path

from bridge.config import parse_config
from bridge.providers.detect import detect
from bridge.simulator import Simulator
from tests.sinks.webhook_receiver import WebhookReceiver
from tests.test_doctor import config_file, doctor, line, receiver  # noqa: F401 (fixture)

NOWHERE = "http://127.0.0.1:9"


def aws_source(sim: Simulator, extra: str = "") -> str:
    return f"""
[source]
provider = "auto"
detect_timeout = 1
[source.gce]
metadata_url = "{NOWHERE}/computeMetadata/v1/"
[source.azure]
imds_url = "{NOWHERE}/metadata/"
[source.aws]
imds_url = "{sim.aws_url}"
{extra}
"""


async def test_auto_detection_finds_aws_through_a_token(aws_sim: Simulator) -> None:
    config = parse_config(
        {
            "source": {
                "detect_timeout": 1,
                "gce": {"metadata_url": f"{NOWHERE}/computeMetadata/v1/"},
                "azure": {"imds_url": f"{NOWHERE}/metadata/"},
                "aws": {"imds_url": aws_sim.aws_url},
            }
        }
    )
    assert await detect(config.source) == "aws"
    assert [r.path for r in aws_sim.requests] == [
        "/latest/api/token",
        "/latest/dynamic/instance-identity/document",
    ]


async def test_a_healthy_aws_setup_passes_every_check(
    aws_sim: Simulator,
    receiver: WebhookReceiver,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    code, output = await doctor(config_file(tmp_path, aws_source(aws_sim), receiver.url))
    assert code == 0, output
    assert "aws (detected)" in line(output, "cloud")
    assert "with an IMDSv2 token, no redirect, no proxy" in line(output, "metadata")
    identity = line(output, "identity")
    assert "arn:aws:ec2:us-east-1:123456789012:instance/i-1234567890abcdef0" in identity
    assert " ok " in line(output, "notices")


async def test_a_spot_interruption_in_force_is_a_warning(
    aws_sim: Simulator,
    receiver: WebhookReceiver,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    aws_sim.aws.interrupt("terminate")
    code, output = await doctor(config_file(tmp_path, aws_source(aws_sim), receiver.url))
    assert code == 0, output
    assert "WARN" in line(output, "notices")
    assert "preempt started" in line(output, "notices")


async def test_a_token_put_that_times_out_names_the_hop_limit(
    aws_sim: Simulator,
    receiver: WebhookReceiver,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    aws_sim.aws.quirks.token_put_timeout = True
    source = aws_source(aws_sim).replace('provider = "auto"', 'provider = "aws"')
    code, output = await doctor(config_file(tmp_path, source, receiver.url))
    assert code == 1
    metadata = line(output, "metadata")
    assert "FAIL" in metadata
    assert "the IMDSv2 token request timed out after 2s (imds_v1_fallback is off)" in metadata
    assert "--http-put-response-hop-limit 2" in output


async def test_v1_fallback_reads_without_a_token_when_the_put_times_out(
    tmp_path: Path,
) -> None:
    from tests.support import running_bridge

    async with Simulator(provider="aws") as sim:
        sim.aws.quirks.token_put_timeout = True  # IMDSv1 still allowed (v2 not required)
        aws = {"imds_v1_fallback": True, "request_timeout": 0.3}
        async with running_bridge(sim, tmp_path, ("aws",), aws=aws) as run:
            sim.aws.interrupt("stop")
            (event,) = await run.wait_for(1, timeout=20)
        reads = [r for r in sim.requests if r.path != "/latest/api/token"]
    assert event["data"]["kind"] == "preempt"
    assert reads
    assert not any("X-aws-ec2-metadata-token" in r.headers for r in reads)
