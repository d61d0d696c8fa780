"""Running one hook: a local command for one maintenance event, without a shell.

The vendors' advice for a maintenance warning is a list of local chores (checkpoint, drain,
leave the load balancer pool, step down as leader, shut down); a hook is one of them as an
argument list. The command gets the event's JSON on stdin and its main fields as `MB_*`
environment variables (on top of the bridge's own environment), so a shell one-liner and
a program that parses JSON are both easy to write. Its output goes to the bridge's log line
by line (capped, so a chatty hook cannot flood the journal) and its tail into the audit
event. It runs in a process group of its own (a new session on POSIX, a new console group in
a Job Object on Windows; `bridge.infra.platform`): at its timeout the whole group is terminated,
then killed, so no grandchild outlives a hook that was given up on. A command whose first
item is a `.ps1` file runs with PowerShell (`POWERSHELL_ARGS`).

Which hooks run when, at most once, is bridge/actions/engine.py's business; this module only
matches and runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Final

from bridge import contract
from bridge.actions.audit import OUTPUT_TAIL_BYTES, HookOutcome
from bridge.config import Hook
from bridge.infra import platform
from bridge.pipeline.typed_events import maintenance

log = logging.getLogger("bridge.hooks")

ENV_PREFIX: Final = "MB_"
#: Lines of one run's output written to the log; the rest is counted, not logged.
MAX_LOGGED_LINES: Final = 200
MAX_LINE_CHARS: Final = 2000
#: Seconds between SIGTERM and SIGKILL to the process group of a hook that ran out of time.
KILL_GRACE: Final = 5.0
#: How a `.ps1` hook is run: no profile, no prompt, whatever the machine's execution policy.
POWERSHELL_ARGS: Final = ("-NoProfile", "-NonInteractive", "-ExecutionPolicy", "Bypass", "-File")
#: Seconds to keep reading output after the hook exited (a daemonized grandchild may hold
#: the pipe open for ever; its output is not the hook's).
DRAIN_AFTER_EXIT: Final = 1.0


def matches(hook: Hook, data: contract.MaintenanceData) -> bool:
    """Whether `hook` runs for a maintenance event with this `data` (empty filter: any)."""
    return (
        (not hook.statuses or data.status in hook.statuses)
        and (not hook.kinds or data.kind in hook.kinds)
        and (not hook.providers or data.provider in hook.providers)
    )


def deadline(hook: Hook, data: contract.MaintenanceData) -> datetime | None:
    """When the hook must have finished: `deadline_before` seconds before not_before."""
    if hook.deadline_before is None or data.not_before is None:
        return None
    return data.not_before - timedelta(seconds=hook.deadline_before)


def environment(
    hook: Hook, event: contract.Event, due: datetime | None, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The bridge's environment plus the event's main fields as `MB_*` variables."""
    data = maintenance(event)

    def text(value: object) -> str:
        return "" if value is None else str(value)

    fields = {
        "HOOK": hook.display_name(),
        "EVENT_TYPE": event.type,
        "EVENT_ID": event.id,
        "EVENT_SOURCE": event.source,
        "NOTICE_ID": data.notice_id,
        "PROVIDER": data.provider,
        "KIND": data.kind,
        "STATUS": data.status,
        "INSTANCE": data.instance.name,
        "INSTANCE_ID": data.instance.id,
        "NOT_BEFORE": None if data.not_before is None else contract.rfc3339(data.not_before),
        "DURATION_SECONDS": data.duration_seconds,
        "ORIGIN": data.origin,
        "AFFECTED": ",".join(data.affected),
        "DEADLINE": due.isoformat().replace("+00:00", "Z") if due else None,
    }
    env = dict(os.environ if base is None else base)
    env.update({ENV_PREFIX + key: text(value) for key, value in fields.items()})
    return env


class _Output:
    """Collects a hook's output: lines to the log (capped), bytes to the tail."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self.lines = 0

    def add(self, line: bytes) -> None:
        self.lines += 1
        if self.lines <= MAX_LOGGED_LINES:
            text = line.decode(errors="replace").rstrip("\n")
            log.info("hook %s: %s", self._name, text[:MAX_LINE_CHARS])
        elif self.lines == MAX_LOGGED_LINES + 1:
            log.info("hook %s: (further output not logged)", self._name)
        self._tail.append(line)
        self._tail_size += len(line)
        while self._tail_size - len(self._tail[0]) >= OUTPUT_TAIL_BYTES:
            self._tail_size -= len(self._tail.popleft())

    def tail(self) -> str:
        return b"".join(self._tail)[-OUTPUT_TAIL_BYTES:].decode(errors="replace")

    async def read(self, stream: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line longer than the reader's limit: take it in pieces
                line = await stream.read(64 * 1024)
            if not line:
                return
            self.add(line)


def command_line(hook: Hook, system: platform.Platform | None = None) -> list[str]:
    """The argument list to start: the hook's command, behind PowerShell for a `.ps1` file."""
    command = list(hook.command)
    if command[0].lower().endswith(".ps1"):
        return [(system or platform.current()).powershell(), *POWERSHELL_ARGS, *command]
    return command


async def _end(
    process: asyncio.subprocess.Process, tree: platform.ProcessTree, grace: float
) -> None:
    """Terminate the hook's process tree; kill it if it lingers past `grace` seconds."""
    tree.terminate()
    try:
        await asyncio.wait_for(process.wait(), grace)
    except TimeoutError:
        tree.kill()
        await process.wait()
    else:
        tree.kill()  # grandchildren that ignored the request


async def run(
    hook: Hook,
    event: contract.Event,
    body: bytes,
    now: datetime,
    cancel_grace: Callable[[], float] = lambda: KILL_GRACE,
) -> HookOutcome:
    """Run `hook` for `event` (`body`: its JSON) and report how it ended.

    Cancelling this coroutine terminates the process tree, kills it after `cancel_grace()`
    seconds (a shutdown has less time to give than `KILL_GRACE`) and re-raises.
    """
    name = hook.display_name()
    due = deadline(hook, maintenance(event))
    timeout = hook.timeout
    if due is not None:
        left = (due - now).total_seconds()
        if left <= 0:
            error = f"its deadline ({hook.deadline_before:g} s before not_before) had passed"
            log.warning("hook %s skipped for %s: %s", name, event.id, error)
            return HookOutcome(name, "skipped", None, 0.0, "", error)
        timeout = min(timeout, left)
    started = time.monotonic()
    system = platform.current()
    try:
        process = await asyncio.create_subprocess_exec(
            *command_line(hook, system),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=environment(hook, event, due),
            **system.spawn_options(),
        )
    except OSError as exc:
        error = f"cannot start {hook.command[0]!r}: {exc.strerror or exc}"
        log.error("hook %s failed for %s: %s", name, event.id, error)
        return HookOutcome(name, "failed", None, time.monotonic() - started, "", error)
    log.info("hook %s started for %s (pid %d, timeout %.0fs)", name, event.id, process.pid, timeout)
    tree = system.contain(process.pid)
    output = _Output(name)
    assert process.stdin is not None
    assert process.stdout is not None
    reader = asyncio.create_task(output.read(process.stdout))
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            process.stdin.write(body)
            await process.stdin.drain()
        process.stdin.close()
        try:
            exit_code: int | None = await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            exit_code = None
            await _end(process, tree, KILL_GRACE)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reader), DRAIN_AFTER_EXIT)
    except asyncio.CancelledError:
        await asyncio.shield(_end(process, tree, cancel_grace()))
        raise
    finally:
        reader.cancel()
        tree.close()
    elapsed = time.monotonic() - started
    if exit_code is None:
        error = f"timed out after {timeout:.1f}s; its process group was terminated"
        outcome = HookOutcome(name, "timed-out", None, elapsed, output.tail(), error)
    elif exit_code == 0:
        outcome = HookOutcome(name, "succeeded", 0, elapsed, output.tail())
    else:
        error = (
            f"killed by signal {-exit_code}" if exit_code < 0 else f"exited with status {exit_code}"
        )
        outcome = HookOutcome(name, "failed", exit_code, elapsed, output.tail(), error)
    level = logging.INFO if outcome.succeeded else logging.WARNING
    log.log(
        level,
        "hook %s %s for %s in %.1fs%s",
        name,
        outcome.outcome,
        event.id,
        elapsed,
        f": {outcome.error}" if outcome.error else "",
    )
    return outcome


def stdin_body(event: contract.Event) -> bytes:
    """What a hook reads on stdin: the event as consumers see it, one JSON line (the
    attributes in the order the sidecar writes them; tests/test_typed_bytes.py pins it)."""
    return contract.encode(event) + b"\n"
