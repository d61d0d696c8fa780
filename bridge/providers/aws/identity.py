"""The EC2 instance's attestation: its instance identity document and that document's
`signature`, read under an IMDSv2 session. The fleet accepts it once per instance (it can be
replayed), so the sidecar renews its credential with the credential, not the document."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.config import Config

SIGNATURE_PATH = "latest/dynamic/instance-identity/signature"


async def attestation(config: Config, audience: str) -> dict[str, str]:
    from bridge.providers.aws import imds, watcher
    from bridge.providers.aws.settings import AwsSource

    settings = config.source.section("aws", AwsSource)
    client = watcher.new_client(settings)
    try:
        session = imds.TokenSession(client, 60, settings.imds_v1_fallback)
        headers = await session.headers()
        document = await client.request_once("GET", imds.IDENTITY_PATH, headers=headers)
        signature = await client.request_once("GET", SIGNATURE_PATH, headers=headers)
    finally:
        await client.aclose()
    return {"method": "aws_iid", "document": document.text, "signature": signature.text.strip()}
