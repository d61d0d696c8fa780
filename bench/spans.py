"""Where the bridge's part of the latency goes: the steps of a notice's way, timed in the bridge.

    python -m bench.spans OUT -m bridge ARGS...

runs `python -m bridge ARGS...` with a few coroutines wrapped before it starts, each call
written to OUT as `start end step` (`time.monotonic()`, one clock for every process of a
Linux host, so the lines line up with the simulator's answers and the receiver's stamps).
A CPU profile cannot say this: most of the bridge's part is waiting (a thread hand-off, an
fsync, the receiver), not computing. `breakdown` turns the lines and a latency series into
the median of each step per transition.

The wrapped names are the bridge's own internals (the spool, the runner, the dispatcher):
if one is renamed, its step is reported missing, the run itself is unaffected.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import io
import runpy
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from bench.stats import Series

#: (module, class, method: a coroutine, or a function run on a thread) -> step name in OUT.
WRAPPED = {
    # the metadata client's request that carried the change (its answer read and checked)
    ("bridge.pipeline.watchers.http", "MetadataClient", "request"): "answer",
    ("bridge.runner", "Bridge", "_commit"): "update",
    ("bridge.pipeline.spool", "Spool", "commit"): "commit",
    # on the spool's thread: any call there, the commit's transaction, its fsync
    ("bridge.pipeline.spool", "Spool", "_call"): "call",
    ("bridge.pipeline.spool", "spool_outbox", "commit"): "transaction",
    ("bridge.pipeline.spool", "Spool", "_fsync"): "fsync",
    ("bridge.pipeline.dispatch", "Dispatcher", "_deliver"): "deliver",
    ("sinks.webhook", "WebhookSink", "_post"): "post",
}


def _wrap(cls: Any, method: str, step: str, out: TextIO) -> None:
    inner: Callable[..., Any] = getattr(cls, method)
    if not inspect.iscoroutinefunction(inner):  # a step on a thread (the spool's fsync)

        @functools.wraps(inner)
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return inner(*args, **kwargs)
            finally:
                out.write(f"{started:.6f} {time.monotonic():.6f} {step}\n")

        setattr(cls, method, timed_call)
        return

    @functools.wraps(inner)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return await inner(*args, **kwargs)
        finally:
            out.write(f"{started:.6f} {time.monotonic():.6f} {step}\n")

    setattr(cls, method, timed)


@contextlib.contextmanager
def timing(wrapped: Mapping[tuple[str, str, str], str]) -> Iterator[dict[str, list[float]]]:
    """Within the block, calls of the `wrapped` coroutines in this process are timed:
    seconds per call, by step name. The originals are put back on the way out."""
    durations: dict[str, list[float]] = {step: [] for step in wrapped.values()}
    originals: list[tuple[Any, str, Any]] = []

    class Collect(io.StringIO):
        def write(self, line: str) -> int:
            start, end, step = line.split(" ", 2)
            durations[step.rstrip("\n")].append(float(end) - float(start))
            return len(line)

    collect = Collect()
    for (module, cls, method), step in wrapped.items():
        owner = getattr(importlib.import_module(module), cls)
        originals.append((owner, method, owner.__dict__[method]))
        _wrap(owner, method, step, collect)
    try:
        yield durations
    finally:
        for owner, method, original in originals:
            setattr(owner, method, original)


def main() -> None:
    out = Path(sys.argv[1]).open("w", buffering=1)  # noqa: SIM115 (open for the process's life)
    for (module, cls, method), step in WRAPPED.items():
        try:
            __import__(module)
            _wrap(getattr(sys.modules[module], cls), method, step, out)
        except (ImportError, AttributeError) as exc:
            print(f"bench.spans: not timing {step}: {exc}", file=sys.stderr)
    sys.argv = [sys.argv[3], *sys.argv[4:]]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)


def read(path: Path) -> dict[str, list[tuple[float, float]]]:
    spans: dict[str, list[tuple[float, float]]] = {}
    for line in path.read_text().splitlines():
        start, end, step = line.split()
        spans.setdefault(step, []).append((float(start), float(end)))
    for calls in spans.values():
        calls.sort()
    return spans


def breakdown(series: Series, path: Path) -> list[str]:
    """Median milliseconds of each step per transition of `series` (the run that wrote
    `path`): from the server's answer until the metadata client returns it, read and
    checked (the plain server's body waits for the head's acknowledgement in there), then
    the update reaching the runner, the events built,
    the hand-off to the spool's thread, the transaction, the waiting worker's window read
    after it, the fsync, the way back to the event loop (the dispatcher is woken when the
    commit returns), the runner's bookkeeping and the dispatcher until the POST starts, the
    POST until the receiver holds the event. The medians of the commits and fsyncs of the
    whole run follow the steps."""
    if not path.exists():
        return ["(the bridge wrote no step timings)"]
    spans = read(path)
    steps: dict[str, list[float]] = {}

    def first_after(step: str, moment: float) -> tuple[float, float] | None:
        return next((c for c in spans.get(step, []) if c[0] >= moment - 1e-4), None)

    def last_end_before(step: str, moment: float) -> float | None:
        return max((end for _, end in spans.get(step, []) if end <= moment), default=None)

    for answered, ours in zip(series.answered, series.ours, strict=True):
        held = answered + ours / 1000
        update = first_after("update", answered)
        commit = first_after("commit", update[0]) if update else None
        if update is None or commit is None:
            continue
        # The request whose answer carried the change returned last before the update.
        returned = last_end_before("answer", update[0])
        if returned is None or returned < answered:
            continue
        call = first_after("call", commit[0])
        transaction = first_after("transaction", commit[0])
        fsync = first_after("fsync", commit[0])
        # The dispatcher is woken when the commit ends (its fsync is inside it).
        post = first_after("post", commit[1])
        if call is None or transaction is None or fsync is None or post is None:
            continue
        for name, start, end in (
            ("the answer read and checked, until the metadata client returns it", answered,
             returned),
            ("parsed and diffed; the update to the runner", returned, update[0]),
            ("events built, until the spool commit starts", update[0], commit[0]),
            ("hand-off to the spool's thread", commit[0], call[0]),
            ("the transaction (SQLite, synchronous=NORMAL)", transaction[0], transaction[1]),
            ("the waiting worker's window, read after it", transaction[1], fsync[0]),
            ("fdatasync of the WAL", fsync[0], fsync[1]),
            ("back to the event loop; the commit returns, the dispatcher is woken",
             call[1], commit[1]),
            ("the runner's bookkeeping, the dispatcher's turn, until the POST starts",
             commit[1], post[0]),
            ("the POST, until the receiver holds the body", post[0], held),
        ):  # fmt: skip
            steps.setdefault(name, []).append((end - start) * 1000)
    if not steps:
        return ["(no transition could be matched with the step timings)"]
    count = len(next(iter(steps.values())))
    lines = [f"where our part goes, median per step over {count} transitions (ms):"]
    lines += [f"  {statistics.median(v):7.2f}  {name}" for name, v in steps.items()]
    commits = [(end - start) * 1000 for start, end in spans.get("commit", [])]
    if commits:
        lines.append(f"  (Spool.commit alone: median {statistics.median(commits):.2f} ms)")
    fsyncs = [(end - start) * 1000 for start, end in spans.get("fsync", [])]
    if fsyncs:
        lines.append(f"  (of which its fsync: median {statistics.median(fsyncs):.2f} ms)")
    return lines


if __name__ == "__main__":
    main()
