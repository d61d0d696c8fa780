"""`maintenance-bridge elect`: run a command only while this VM leads an etcd election, and
never lead on a VM about to go away, nor after the lease may have expired.

Applications that elect a leader keep leading on a VM until it vanishes, and may even win
an election a minute before its maintenance. The wrapper puts the bridge's `/v1/eligible`
in the loop, so getting it right is one command line:

1. Wait until `/v1/eligible` answers 200 (no maintenance within the horizon). An
   unreachable or failing bridge counts as "not eligible": a VM that cannot vouch for
   itself does not lead.
2. Campaign on the election (etcd's own election API, `/v3/election/campaign`, on a lease
   renewed every third of its TTL). If the VM becomes ineligible while it waits, the
   candidacy is withdrawn (its lease revoked) before it can win.
3. Once leader, start the command, held so that it and everything it starts end with this
   process however it ends (`Platform.held`: a watchdog on POSIX, a Job Object on Windows),
   with `MB_ELECTION`, `MB_LEADER_KEY`, `MB_FENCING_TOKEN` and `MB_LEASE_ID` set. While it
   runs, eligibility is checked every `--interval` seconds.
4. A notice blocks: the command is terminated (SIGTERM, SIGKILL after `--grace`), then
   leadership is resigned, in that order, so two leaders never run at once. Back to 1: no
   new campaign while the notice blocks.
5. The command exits by itself: resign and exit with its status. SIGTERM or SIGINT to the
   wrapper: terminate the command, resign, exit.
6. The lease cannot be renewed: at the local deadline (`Timing`) the command is stopped
   and leadership is taken as lost whatever etcd says later, before the lease can expire
   at etcd and another candidate be elected. Back to 1.

The fencing token (`MB_FENCING_TOKEN`) is the etcd revision at which this leadership's key
was created: each new leader's key is created after every earlier leader's (a candidate
leads when its key is the oldest left), so the token strictly increases with every new
leadership; a store that remembers the highest token it saw refuses a deposed leader's
late writes (docs/coordination.md).

Everything etcd-related is the budget's client (bridge/actions/coordination/etcd.py): the same
endpoints, TLS and credentials as `[coordination]`, or `--endpoint` on the command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from bridge.actions.coordination.backend import EngineError, Unavailable
from bridge.actions.coordination.elect_args import DEFAULT_ELIGIBLE_URL
from bridge.actions.coordination.etcd import EtcdClient, b64, unb64
from bridge.actions.coordination.lease_timing import Timing
from bridge.actions.coordination.settings import Coordination
from bridge.infra import platform
from bridge.infra.buildinfo import user_agent
from bridge.infra.http1 import Http1Client, TransportError
from bridge.infra.platform.base import Platform, ProcessTree

log = logging.getLogger("bridge.elect")
T = TypeVar("T")

#: A campaign can wait for days; its request must not time out meanwhile.
CAMPAIGN_TIMEOUT: Final = 365 * 24 * 3600.0


@dataclass(slots=True)
class Leadership:
    """What the command is told of its leadership (its environment)."""

    key: str
    token: int
    lease: int
    #: etcd's `LeaderKey` as the campaign answered it (what `resign` takes).
    raw: dict[str, Any]

    def environ(self, election: str) -> dict[str, str]:
        return {
            "MB_ELECTION": election,
            "MB_LEADER_KEY": self.key,
            "MB_FENCING_TOKEN": str(self.token),
            "MB_LEASE_ID": str(self.lease),
        }


class LeaseLost(Exception):
    """The lease was not renewed by the local deadline, or etcd said it is gone."""


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
        system: Platform | None = None,
    ) -> None:
        self.system = system or platform.current()
        self.client = EtcdClient(settings)
        self.name = f"{settings.prefix}election/{election}"
        #: Raises RuntimeError where the command cannot be held (Windows without pywin32).
        self.argv = self.system.held(command)
        self.value = value or socket.gethostname()
        self.timing = Timing(float(ttl), settings.request_timeout)
        self.ttl = ttl
        self.interval = interval
        self.grace = grace
        self._eligibility = Http1Client(
            eligible_url, timeout=max(interval, 2.0), user_agent=user_agent()
        )
        self.stop = asyncio.Event()
        #: Loop time the last successful renewal (or the grant) was sent.
        self._renewed_sent = 0.0

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
            except (Unavailable, EngineError, TimeoutError) as exc:
                log.warning("etcd: %s; trying again in %gs", exc or "no answer", self.interval)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), self.interval)
                continue
            if status is not None:
                return status
        return 0

    async def _bounded(self, call: Awaitable[T], limit: float | None = None) -> T:
        """`call` within `limit` (default: the leader's request timeout) in all, whatever
        the number of endpoints tried."""
        async with asyncio.timeout(self.timing.request_timeout if limit is None else limit):
            return await call

    async def _term(self) -> int | None:
        """One candidacy on a fresh lease: None when it ended without the command exiting."""
        sent = asyncio.get_running_loop().time()
        lease = await self._bounded(self.client.grant(self.ttl))
        self._renewed_sent = sent
        renew = asyncio.create_task(self._renew(lease), name="elect:lease")
        try:
            leader = await self._campaign(lease, renew)
            if leader is None:
                return None
            log.info(
                "elected leader of %s as %s (fencing token %d)", self.name, self.value, leader.token
            )
            return await self._lead(leader, renew)
        finally:
            renew.cancel()
            with contextlib.suppress(asyncio.CancelledError, LeaseLost):
                await renew
            with contextlib.suppress(Unavailable, EngineError, TimeoutError):
                # withdraws the candidacy or the leadership
                await self._bounded(self.client.revoke(lease, timeout=self.timing.request_timeout))

    async def _renew(self, lease: int) -> None:
        """Renew until the lease is lost (raises `LeaseLost`) or cancelled (see `Timing`)."""
        loop = asyncio.get_running_loop()
        timing = self.timing
        due = self._renewed_sent + timing.renew_every
        while True:
            deadline = timing.deadline(self._renewed_sent)
            await asyncio.sleep(max(0.0, min(due, deadline) - loop.time()))
            now = loop.time()
            if now >= deadline:
                raise LeaseLost(f"not renewed within {deadline - self._renewed_sent:.2g}s")
            try:
                limit = min(timing.request_timeout, deadline - now)
                ttl = await self._bounded(self.client.keepalive(lease, timeout=limit), limit)
            except (Unavailable, EngineError, TimeoutError) as exc:
                log.warning(
                    "cannot renew the election lease (leadership ends in %.1fs unless renewed): %s",
                    max(0.0, deadline - loop.time()),
                    exc or "no answer",
                )
                due = loop.time() + timing.retry_pause
                continue
            if ttl <= 0:
                raise LeaseLost("etcd says the lease is gone")
            self._renewed_sent = now
            due = now + timing.renew_every

    async def _campaign(self, lease: int, renew: asyncio.Task[None]) -> Leadership | None:
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
                if renew.done():
                    return None  # elected on a lease we already count as lost
                return Leadership(
                    unb64(leader.get("key")), int(leader.get("rev") or 0), lease, leader
                )
            if blocked.done() and blocked.result():
                log.info("a notice blocks: withdrawing the candidacy")
            elif renew.done():
                log.warning("the candidacy's lease is lost (%s)", _why(renew))
            return None
        finally:
            for task in (campaign, blocked):
                task.cancel()
            await asyncio.gather(campaign, blocked, return_exceptions=True)

    async def _lead(self, leader: Leadership, renew: asyncio.Task[None]) -> int | None:
        process, tree = await self._start(leader)
        exited = asyncio.create_task(process.wait())
        blocked = asyncio.create_task(self._until(False))
        try:
            await asyncio.wait({exited, blocked, renew}, return_when=asyncio.FIRST_COMPLETED)
            if exited.done():
                status = exited.result()
                log.info("the command exited with status %d: resigning", status)
                await self._end(process, tree, renew)  # what it left running
                await self._resign(leader)
                return status
            if renew.done():
                # Leadership is lost now, whatever etcd says later: stop by `kill_by`.
                log.warning("leadership lost (%s): stopping the command", _why(renew))
                await self._end(process, tree, renew)
                return 0 if self.stop.is_set() else None
            why = "a notice blocks" if blocked.done() and blocked.result() else "stopping"
            log.info("%s: stopping the command, then resigning", why)
            await self._end(process, tree, renew)
            await self._resign(leader)
            return 0 if self.stop.is_set() else None
        finally:
            blocked.cancel()
            exited.cancel()
            await asyncio.gather(exited, blocked, return_exceptions=True)
            if process.returncode is None:
                await self._end(process, tree, grace=0.0)

    async def _start(self, leader: Leadership) -> tuple[asyncio.subprocess.Process, ProcessTree]:
        """The command, held (see the module docstring) and contained at once."""
        env = {**os.environ, **leader.environ(self.name)}
        process = await asyncio.create_subprocess_exec(
            *self.argv, env=env, **self.system.spawn_options()
        )
        return process, self.system.contain(process.pid)

    async def _end(
        self,
        process: asyncio.subprocess.Process,
        tree: ProcessTree,
        renew: asyncio.Task[None] | None = None,
        grace: float | None = None,
    ) -> None:
        """End the command and everything it started (its process group or Job Object):
        terminate, kill after `grace` (default `--grace`), and what is left once it exited.
        Should the lease be lost meanwhile (`renew` ends), the grace ends at `kill_by`."""
        try:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    tree.terminate()
                if not await self._exits(process, renew, self.grace if grace is None else grace):
                    log.warning("the command did not stop in time: killing it")
            with contextlib.suppress(ProcessLookupError):
                tree.kill()  # the rest of the tree, or all of it
            await process.wait()
        finally:
            tree.close()

    async def _exits(
        self, process: asyncio.subprocess.Process, renew: asyncio.Task[None] | None, grace: float
    ) -> bool:
        """Whether `process` exits within `grace`, cut to the lease's `kill_by` once `renew`
        has ended (the lease is lost)."""
        loop = asyncio.get_running_loop()
        end_at = loop.time() + grace
        exited = asyncio.ensure_future(process.wait())
        try:
            while not exited.done():
                waiting: set[asyncio.Future[Any]] = {exited}
                if renew is not None and renew.done():
                    end_at = min(end_at, self.timing.kill_by(self._renewed_sent))
                elif renew is not None:
                    waiting.add(renew)
                left = end_at - loop.time()
                if left <= 0:
                    return False
                await asyncio.wait(waiting, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            return True
        finally:
            exited.cancel()

    async def _resign(self, leader: Leadership) -> None:
        with contextlib.suppress(Unavailable, EngineError, TimeoutError):
            await self._bounded(
                self.client.call(
                    "election/resign", {"leader": leader.raw}, timeout=self.timing.request_timeout
                )
            )


def _why(renew: asyncio.Task[None]) -> str:
    if renew.cancelled():
        return "cancelled"
    exc = renew.exception()
    return str(exc) if exc is not None else "renewals ended"
