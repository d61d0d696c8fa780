"""`provider = "auto"`: find out which metadata service this VM has.

All three services are probed at once with a short timeout. GCE counts only when it answers
with `Metadata-Flavor: Google`; Azure only when `/metadata/instance` answers JSON with a
`compute` section; AWS only when a token PUT and the instance identity document succeed
(bridge/providers/aws/imds.py). Anything else (a captive proxy, a laptop) is "none", with
each probe's reason in the error so the user sees what to fix.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from bridge.config import Source
from bridge.infra.http1 import Http1Client, Response, TransportError
from bridge.pipeline.watchers.http import USER_AGENT
from bridge.providers.azure.watcher import INSTANCE_API_VERSION


class DetectionError(Exception):
    pass


async def _get(
    url: str, path: str, headers: dict[str, str], timeout: float, **params: str
) -> Response:
    """One GET, no redirect, no proxy: `TransportError` when it gets no answer."""
    client = Http1Client(url, timeout=timeout, user_agent=USER_AGENT, headers=headers)
    try:
        return await client.request("GET", path, params=params)
    finally:
        await client.aclose()


async def _probe_gce(url: str, timeout: float) -> str | None:
    try:
        response = await _get(url, "", {"Metadata-Flavor": "Google"}, timeout)
    except TransportError as exc:
        return f"GCE metadata server at {url}: {type(exc).__name__} {exc}".strip()
    if response.headers.get("metadata-flavor") != "Google":
        return f"GCE metadata server at {url}: no 'Metadata-Flavor: Google' in the answer"
    return None


async def _probe_azure(url: str, timeout: float) -> str | None:
    try:
        response = await _get(
            url, "instance", {"Metadata": "true"}, timeout, **{"api-version": INSTANCE_API_VERSION}
        )
    except TransportError as exc:
        return f"Azure IMDS at {url}: {type(exc).__name__} {exc}".strip()
    try:
        if response.status == 200 and "compute" in response.json():
            return None
    except (ValueError, TypeError):
        pass
    return f"Azure IMDS at {url}: HTTP {response.status}, not an instance document"


async def detect(source: Source) -> Literal["gce", "azure", "aws"]:
    """The provider to watch; `DetectionError` explains why when there is none."""
    from bridge.providers.aws import imds as aws_imds

    if source.provider != "auto":
        return source.provider
    gce_problem, azure_problem, aws_problem = await asyncio.gather(
        _probe_gce(source.gce.resolved_url(), source.detect_timeout),
        _probe_azure(source.azure.imds_url, source.detect_timeout),
        aws_imds.probe(source.aws.imds_url, source.detect_timeout),
    )
    if gce_problem is None:
        return "gce"
    if azure_problem is None:
        return "azure"
    if aws_problem is None:
        return "aws"
    raise DetectionError(
        "no metadata service found (set source.provider to skip detection):\n"
        f"  {gce_problem}\n  {azure_problem}\n  {aws_problem}"
    )
