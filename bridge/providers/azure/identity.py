"""The Azure VM's attestation: a managed-identity token for the fleet's resource (its
`xms_mirid` names the VM), or, on a VM without a managed identity, the attested document
(PKCS#7, vmId and subscription) with a nonce the fleet checks for freshness."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from bridge.infra.credential import AttestationUnavailable

if TYPE_CHECKING:
    from bridge.config import Config

TOKEN_PATH = "identity/oauth2/token"  # noqa: S105 (a path)
ATTESTED_PATH = "attested/document"


async def attestation(config: Config, audience: str) -> dict[str, str]:
    from bridge.providers.azure import watcher
    from bridge.providers.azure.settings import AzureSource

    client = watcher.new_client(config.source.section("azure", AzureSource))
    try:
        token = await client.request_once(
            "GET",
            TOKEN_PATH,
            params={"api-version": "2018-02-01", "resource": audience},
            accept=(200, 400),
        )
        if token.status == 200:
            return {"method": "azure_msi", "document": str(json.loads(token.text)["access_token"])}
        if "Identity not found" not in token.text:
            raise AttestationUnavailable(f"managed-identity token refused: {token.text[:200]}")
        nonce = str(int(time.time()))
        attested = await client.request_once(
            "GET", ATTESTED_PATH, params={"api-version": "2020-09-01", "nonce": nonce}
        )
        signature = str(json.loads(attested.text)["signature"])
    except (ValueError, KeyError, TypeError) as exc:
        raise AttestationUnavailable(f"IMDS identity answer unreadable: {exc}") from exc
    finally:
        await client.aclose()
    return {"method": "azure_attested", "document": signature, "nonce": nonce}
