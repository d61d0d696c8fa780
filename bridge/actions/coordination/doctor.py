"""`maintenance-bridge doctor`'s coordination line: the engine, the group and its holders."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from bridge.actions.coordination.backend import EngineError, Unavailable
from bridge.actions.coordination.budget import group_of
from bridge.actions.coordination.etcd import EtcdBackend
from bridge.infra.findings import Finding

if TYPE_CHECKING:
    from bridge.config import Config
    from bridge.pipeline.model import Instance


async def check(config: Config, instance: Instance | None, timeout: float) -> list[Finding]:
    """One finding: reachable (version, group, slots taken) or not (and what to fix)."""
    settings = config.coordination
    assert settings is not None
    backend = EtcdBackend(settings)
    name = "coordination"
    try:
        described = await asyncio.wait_for(backend.describe(), timeout)
        if instance is None and settings.group in ("scale-set", "zone"):
            return [Finding(name, "ok", f"{described}; group unknown without the VM identity")]
        group = group_of(settings, instance)
        holders = await asyncio.wait_for(backend.holders(group), timeout)
    except (Unavailable, EngineError, TimeoutError) as exc:
        what = "on_unavailable = proceed: disruptive actions go ahead without a slot"
        if settings.on_unavailable == "wait":
            what = "on_unavailable = wait: disruptive actions wait until it answers"
        return [
            Finding(
                name,
                "fail",
                f"etcd cannot be used: {exc or 'no answer in time'} ({what})",
                "check coordination.endpoints, the network path to etcd, and its TLS or "
                "user settings",
            )
        ]
    finally:
        await backend.aclose()
    taken = ", ".join(f"{h.member}" for h in holders) or "none"
    return [
        Finding(
            name,
            "ok",
            f"{described}; group {group}: {len(holders)} of {settings.budget} slot(s) taken "
            f"({taken})",
        )
    ]
