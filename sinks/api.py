"""The sink plug-in surface under its first name: `bridge.sinkapi`, re-exported unchanged.

Third-party sinks written against `sinks.api` keep working; new code (the built-in sinks
included) imports `bridge.sinkapi`, at the bridge's floor just above its infrastructure,
beside the sink registry (`bridge.sink_registry`).
"""

from __future__ import annotations

from bridge.sinkapi import *  # noqa: F403 (the whole surface, as `bridge.sinkapi.__all__` lists it)
from bridge.sinkapi import __all__ as __all__
