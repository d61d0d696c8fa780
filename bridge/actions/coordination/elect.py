"""`maintenance-bridge elect`: run a command only while this VM leads an etcd election, and
never lead on a VM about to go away.

Applications that elect a leader keep leading on a VM until it vanishes, and may even win
an election a minute before its maintenance. The wrapper puts the bridge's `/v1/eligible`
in the loop, so getting it right is one command line:

1. Wait until `/v1/eligible` answers 200 (no maintenance within the horizon). An
   unreachable or failing bridge counts as "not eligible": a VM that cannot vouch for
   itself does not lead.
2. Campaign on the election (etcd's own election API, `/v3/election/campaign`, on a lease
   renewed every third of its TTL). If the VM becomes ineligible while it waits, the
   candidacy is withdrawn (its lease revoked) before it can win.
3. Once leader, start the command (in its own process group) with `MB_ELECTION`,
   `MB_LEADER_KEY` set. While it runs, eligibility is checked every `--interval` seconds.
4. A notice blocks: the command is terminated (SIGTERM, SIGKILL after `--grace`), then
   leadership is resigned, in that order, so two leaders never run at once. Back to 1: no
   new campaign while the notice blocks.
5. The command exits by itself: resign and exit with its status. The lease is lost (etcd
   unreachable for longer than the TTL): terminate the command, back to 1. SIGTERM or
   SIGINT to the wrapper: terminate the command, resign, exit.

Everything etcd-related is the budget's client (bridge/actions/coordination/etcd.py): the same
endpoints, TLS and credentials as `[coordination]`, or `--endpoint` on the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Sequence
from typing import Any, Final

from bridge import __version__
from bridge.actions.coordination.backend import EngineError, Unavailable
from bridge.actions.coordination.elect_args import DEFAULT_ELIGIBLE_URL
from bridge.actions.coordination.etcd import EtcdClient, b64
from bridge.actions.coordination.settings import Coordination
from bridge.infra import platform
from bridge.infra.http1 import Http1Client, TransportError
from bridge.infra.platform.base import ProcessTree

log = logging.getLogger("bridge.elect")

#: A campaign can wait for days; its request must not time out meanwhile.
CAMPAIGN_TIMEOUT: Final = 365 * 24 * 3600.0


def settings_from(args: argparse.Namespace, configured: Coordination | None) -> Coordination:
    """The etcd settings: `--endpoint` wins over `[coordination]`."""
    import msgspec

    from bridge.infra.validation import validate

    if configured is not None:
        settings = configured
        if args.endpoint:
            endpoints = validate(Coordination, {"endpoints": args.endpoint}).endpoints
            settings = msgspec.structs.replace(settings, endpoints=endpoints)
        return settings
    return validate(Coordination, {"endpoints": args.endpoint}, "--endpoint")


class Elector:
    """One candidate running `command` while it leads (see the module docstring)."""

    def __init__(
        self,
        settings: Coordination,
        election: str,
        command: Sequence[str],
        *,
        eligible_url: str = DEFAULT_ELIGIBLE_URL,
        value: str = "",
        ttl: int = 10,
        interval: float = 1.0,
        grace: float = 10.0,
    ) -> None:
        self.client = EtcdClient(settings)
        self.name = f"{settings.prefix}election/{election}"
        self.command = list(command)
        self.value = value or socket.gethostname()
        self.ttl = ttl
        self.interval = interval
        self.grace = grace
        self._eligibility = Http1Client(
            eligible_url, timeout=max(interval, 2.0), user_agent=f"maintenance-bridge/{__version__}"
        )
        self.stop = asyncio.Event()

    async def aclose(self) -> None:
        await self.client.aclose()
        await self._eligibility.aclose()

    async def eligible(self) -> bool:
        try:
            response = await self._eligibility.request("GET")
        except TransportError as exc:
            log.warning("the bridge cannot be asked (%s): not eligible", exc)
            return False
        return response.status == 200

    async def _until(self, condition: bool) -> bool:
        """Wait until eligibility equals `condition`; False when asked to stop first."""
        while not self.stop.is_set():
            if await self.eligible() is condition:
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.interval)
        return False

    async def run(self) -> int:
        """Campaign, lead, step down, again; the command's exit status when it ends."""
        while not self.stop.is_set():
            if not await self.eligible():
                log.info("not eligible (a notice blocks): not campaigning")
                if not await self._until(True):
                    break
            try:
                status = await self._term()
            except (Unavailable, EngineError) as exc:
                log.warning("etcd: %s; trying again in %gs", exc, self.interval)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), self.interval)
                continue
            if status is not None:
                return status
        return 0

    async def _term(self) -> int | None:
        """One candidacy on a fresh lease: None when it ended without the command exiting."""
        lease = await self.client.grant(self.ttl)
        renew = asyncio.create_task(self._renew(lease), name="elect:lease")
        try:
            leader = await self._campaign(lease, renew)
            if leader is None:
                return None
            log.info("elected leader of %s as %s", self.name, self.value)
            return await self._lead(leader, renew)
        finally:
            renew.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renew
            with contextlib.suppress(Unavailable, EngineError):
                await self.client.revoke(lease)  # withdraws the candidacy or the leadership

    async def _renew(self, lease: int) -> None:
        """Renew until the lease is gone (returns) or cancelled; unreachable etcd is retried."""
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                if await self.client.keepalive(lease) <= 0:
                    log.warning("the election lease expired")
                    return
            except (Unavailable, EngineError) as exc:
                log.warning("cannot renew the election lease: %s", exc)

    async def _campaign(self, lease: int, renew: asyncio.Task[None]) -> dict[str, Any] | None:
        """Campaign until elected; None if the VM turned ineligible, the lease was lost or
        the wrapper is stopping."""
        body = {"name": b64(self.name), "lease": str(lease), "value": b64(self.value)}
        campaign = asyncio.create_task(
            self.client.call("election/campaign", body, timeout=CAMPAIGN_TIMEOUT)
        )
        blocked = asyncio.create_task(self._until(False))
        try:
            await asyncio.wait({campaign, blocked, renew}, return_when=asyncio.FIRST_COMPLETED)
            if campaign.done():
                leader: dict[str, Any] = campaign.result()["leader"]
                return leader
            if blocked.done() and blocked.result():
                log.info("a notice blocks: withdrawing the candidacy")
            return None
        finally:
            for task in (campaign, blocked):
                task.cancel()
            await asyncio.gather(campaign, blocked, return_exceptions=True)

    async def _lead(self, leader: dict[str, Any], renew: asyncio.Task[None]) -> int | None:
        env = {**os.environ, "MB_ELECTION": self.name, "MB_LEADER_KEY": leader.get("key", "")}
        process = await asyncio.create_subprocess_exec(
            *self.command, env=env, **platform.current().spawn_options()
        )
        # Contained at once, so everything the command starts is ended with it (on Windows a
        # Job Object; on POSIX its own process group).
        tree = platform.current().contain(process.pid)
        exited = asyncio.create_task(process.wait())
        blocked = asyncio.create_task(self._until(False))
        try:
            await asyncio.wait({exited, blocked, renew}, return_when=asyncio.FIRST_COMPLETED)
            if exited.done():
                status = exited.result()
                log.info("the command exited with status %d: resigning", status)
                await self._resign(leader)
                return status
            why = "a notice blocks" if blocked.done() and blocked.result() else "stopping"
            if renew.done():
                why = "the lease was lost"
            log.info("%s: stopping the command, then resigning", why)
            await self._end(process, tree)
            await self._resign(leader)
            return 0 if self.stop.is_set() else None
        finally:
            blocked.cancel()
            exited.cancel()
            await asyncio.gather(exited, blocked, return_exceptions=True)
            if process.returncode is None:
                await self._end(process, tree)

    async def _end(self, process: asyncio.subprocess.Process, tree: ProcessTree) -> None:
        """End the command and everything it started (its process group or Job Object)."""
        try:
            with contextlib.suppress(ProcessLookupError):
                tree.terminate()
            try:
                await asyncio.wait_for(process.wait(), self.grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    tree.kill()
                await process.wait()
        finally:
            tree.close()

    async def _resign(self, leader: dict[str, Any]) -> None:
        with contextlib.suppress(Unavailable, EngineError):
            await self.client.call("election/resign", {"leader": leader})


async def main(args: argparse.Namespace, configured: Coordination | None) -> int:
    """The `elect` subcommand."""
    command = list(args.program)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise SystemExit("maintenance-bridge elect: give the command after --")
    settings = settings_from(args, configured)
    elector = Elector(
        settings,
        args.election,
        command,
        eligible_url=args.eligible_url,
        value=args.value,
        ttl=args.ttl,
        interval=args.interval,
        grace=args.grace,
    )
    platform.current().install_stop_handlers(
        asyncio.get_running_loop(), lambda _name: elector.stop.set(), lambda: None
    )
    try:
        return await elector.run()
    finally:
        await elector.aclose()
