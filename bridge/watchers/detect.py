"""`provider = "auto"`: find out which metadata service this VM has.

Both services are probed at once with a short timeout. GCE counts only when it answers with
`Metadata-Flavor: Google`; Azure only when `/metadata/instance` answers JSON with a
`compute` section. Anything else (a captive proxy, a laptop) is "neither", with each probe's
reason in the error so the user sees what to fix.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import httpx

from bridge.config import Source
from bridge.watchers.azure import INSTANCE_API_VERSION


class DetectionError(Exception):
    pass


async def _probe_gce(url: str, timeout: float) -> str | None:
    async with httpx.AsyncClient(timeout=timeout, trust_env=False, follow_redirects=False) as c:
        try:
            response = await c.get(url, headers={"Metadata-Flavor": "Google"})
        except httpx.HTTPError as exc:
            return f"GCE metadata server at {url}: {type(exc).__name__} {exc}".strip()
    if response.headers.get("metadata-flavor") != "Google":
        return f"GCE metadata server at {url}: no 'Metadata-Flavor: Google' in the answer"
    return None


async def _probe_azure(url: str, timeout: float) -> str | None:
    async with httpx.AsyncClient(timeout=timeout, trust_env=False, follow_redirects=False) as c:
        try:
            response = await c.get(
                url + "instance",
                params={"api-version": INSTANCE_API_VERSION},
                headers={"Metadata": "true"},
            )
        except httpx.HTTPError as exc:
            return f"Azure IMDS at {url}: {type(exc).__name__} {exc}".strip()
    try:
        if response.status_code == 200 and "compute" in response.json():
            return None
    except ValueError:
        pass
    return f"Azure IMDS at {url}: HTTP {response.status_code}, not an instance document"


async def detect(source: Source) -> Literal["gce", "azure"]:
    """The provider to watch; `DetectionError` explains why when there is none."""
    if source.provider != "auto":
        return source.provider
    gce_problem, azure_problem = await asyncio.gather(
        _probe_gce(source.gce.resolved_url(), source.detect_timeout),
        _probe_azure(source.azure.imds_url, source.detect_timeout),
    )
    if gce_problem is None:
        return "gce"
    if azure_problem is None:
        return "azure"
    raise DetectionError(
        "no metadata service found (set source.provider to skip detection):\n"
        f"  {gce_problem}\n  {azure_problem}"
    )
