"""Several Azure VMs of one availability set or placement group against one simulator.

Scheduled Events are per group: every VM of it sees the same events, and an approval by any
of them lets the event proceed for all. `AzureGroup` serves the simulator's one Azure state
to several VM identities, each under its own path (`http://host:port/<name>/metadata/`),
so several bridges can share it. Each member has its own `/metadata/instance` (its name,
vmId and resourceId) and its approvals are logged with the member's name as `client`
(`sim.azure.approval_log`), so a test can tell who approved.

The simulator's own port keeps serving the simulator's identity; faults and the request log
apply there, not to the members' paths.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from aiohttp import web

from bridge.simulator.serving import Served

from .http import routes

if TYPE_CHECKING:
    from bridge.simulator.attestation import Signer
    from bridge.simulator.faults import Faults
    from bridge.simulator.server import Simulator

    from .state import AzureState


class _Member:
    """What `routes` reads of a simulator, with one member's identity."""

    def __init__(self, sim: Simulator, name: str) -> None:
        self.azure: AzureState = sim.azure
        self.stopping = sim.stopping
        self._sim = sim
        self.identity = sim.identity.replace(
            "azure",
            replace(
                sim.identity.azure,
                name=name,
                vm_id=str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
                explicit_resource_id="",
            ),
        )

    @property
    def signer(self) -> Signer:
        """The simulator's keys, which sign the member's identity documents."""
        return self._sim.signer

    @property
    def faults(self) -> Faults:
        return self._sim.faults


def _as_client(name: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        return await handler(request.clone(remote=name))

    return middleware


class AzureGroup(Served):
    """Serve `sim`'s Azure Scheduled Events to the VMs `names` (see the module docstring)."""

    def __init__(self, sim: Simulator, names: Sequence[str], host: str = "127.0.0.1") -> None:
        self.sim = sim
        self.names = list(names)
        self.host = host
        self.port = 0
        self._runner: web.AppRunner | None = None

    def imds_url(self, name: str) -> str:
        """The `source.azure.imds_url` of member `name`."""
        return f"http://{self.host}:{self.port}/{name}/metadata/"

    async def start(self) -> None:
        app = web.Application()
        for name in self.names:
            member = web.Application(middlewares=[_as_client(name)])
            member.add_routes(routes(cast("Simulator", _Member(self.sim, name))))
            app.add_subapp(f"/{name}/", member)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
