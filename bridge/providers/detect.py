"""`provider = "auto"`: find out which metadata service this VM has.

Every registered provider is probed at once with a short timeout, each by its own rule
(`ProviderPlugin.probe`: GCE counts only with `Metadata-Flavor: Google`, Azure only when
`/metadata/instance` answers JSON with a `compute` section, AWS only when a token PUT and the
instance identity document succeed). Anything else (a captive proxy, a laptop) is "none",
with each probe's reason in the error so the user sees what to fix.
"""

from __future__ import annotations

import asyncio

from bridge.config import Source
from bridge.contract import ProviderName
from bridge.providers import plugins


class DetectionError(Exception):
    pass


async def detect(source: Source) -> ProviderName:
    """The provider to watch; `DetectionError` explains why when there is none."""
    if source.provider != "auto":
        return source.provider
    providers = [plugins.get(name) for name in plugins.names()]
    problems = await asyncio.gather(*(provider.probe(source) for provider in providers))
    for provider, problem in zip(providers, problems, strict=True):
        if problem is None:
            return provider.name
    raise DetectionError(
        "no metadata service found (set source.provider to skip detection):\n"
        + "\n".join(f"  {problem}" for problem in problems)
    )
