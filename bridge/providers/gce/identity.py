"""The GCE VM's attestation: the identity token of its service account, for the fleet's
audience, with the instance named (`format=full`). A VM without a service account gets 404
and cannot attest this way: attach one (it needs no role)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge.infra.credential import AttestationUnavailable

if TYPE_CHECKING:
    from bridge.config import Config

PATH = "instance/service-accounts/default/identity"


async def attestation(config: Config, audience: str) -> dict[str, str]:
    from bridge.providers.gce import watcher
    from bridge.providers.gce.settings import GceSource

    client = watcher.new_client(config.source.section("gce", GceSource))
    try:
        response = await client.request_once(
            "GET", PATH, params={"audience": audience, "format": "full"}, accept=(200, 404)
        )
    finally:
        await client.aclose()
    if response.status == 404:
        raise AttestationUnavailable(
            "GCE issues identity tokens only to VMs with a service account: attach one "
            "(no role needed) for the fleet to accept this VM's events"
        )
    return {"method": "gce_iit", "document": response.text.strip()}
