"""Each cloud's identity document fetched from the simulator with plain HTTP, as a sidecar
would, and the enrollment request a sidecar makes of it."""

from __future__ import annotations

import time
from typing import Any

import httpx

from bridge.simulator import Simulator

#: The fleet's audience the documents are asked for (the GCE token's, the Azure token's
#: resource).
AUDIENCE = "https://fleet.example.test"

GOOGLE = {"Metadata-Flavor": "Google"}
AZURE = {"Metadata": "true"}


async def gce_token(sim: Simulator, client: httpx.AsyncClient) -> httpx.Response:
    return await client.get(
        f"{sim.gce_url}instance/service-accounts/default/identity",
        params={"audience": AUDIENCE, "format": "full"},
        headers=GOOGLE,
    )


async def azure_token(sim: Simulator, client: httpx.AsyncClient) -> httpx.Response:
    return await client.get(
        f"{sim.base_url}/metadata/identity/oauth2/token",
        params={"api-version": "2018-02-01", "resource": AUDIENCE},
        headers=AZURE,
    )


async def azure_attested(sim: Simulator, client: httpx.AsyncClient, nonce: str) -> httpx.Response:
    return await client.get(
        f"{sim.base_url}/metadata/attested/document",
        params={"api-version": "2020-09-01", "nonce": nonce},
        headers=AZURE,
    )


async def aws_document(sim: Simulator, client: httpx.AsyncClient) -> tuple[str, str]:
    token = await client.put(
        f"{sim.base_url}/latest/api/token",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
    )
    headers = {"X-aws-ec2-metadata-token": token.text}
    base = f"{sim.base_url}/latest/dynamic/instance-identity"
    document = await client.get(f"{base}/document", headers=headers)
    signature = await client.get(f"{base}/signature", headers=headers)
    assert document.status_code == signature.status_code == 200
    return document.text, signature.text


def source_of(sim: Simulator, cloud: str) -> str:
    """The CloudEvents source the simulated VM's sidecar stamps on its events."""
    if cloud == "gce":
        g = sim.identity.gce
        resource = f"projects/{g.project_id}/zones/{g.zone}/instances/{g.instance_name}"
        return f"//compute.googleapis.com/{resource}"
    if cloud.startswith("azure"):
        return str(sim.identity.azure.resource_id)
    a = sim.identity.aws
    return f"arn:aws:ec2:{a.region}:{a.account_id}:instance/{a.instance_id}"


async def enrollment(sim: Simulator, client: httpx.AsyncClient, method: str) -> dict[str, Any]:
    """The `POST /v1/enroll` body of the simulated VM, for `method`."""
    cloud = {"gce_iit": "gce", "azure_msi": "azure", "azure_attested": "azure", "aws_iid": "aws"}
    request: dict[str, Any] = {"method": method, "source": source_of(sim, cloud[method])}
    if method == "gce_iit":
        request["document"] = (await gce_token(sim, client)).text
    elif method == "azure_msi":
        request["document"] = (await azure_token(sim, client)).json()["access_token"]
    elif method == "azure_attested":
        nonce = str(int(time.time()))
        request["document"] = (await azure_attested(sim, client, nonce)).json()["signature"]
        request["nonce"] = nonce
    else:
        request["document"], request["signature"] = await aws_document(sim, client)
    return request
