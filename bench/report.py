"""The report: a markdown table of our figures against the targets and the vendors' samples,
the details behind each, profiles for what missed, and the latency-distribution plot."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from bench.drain import HTTP1_ALONE, SYNC_CLIENT, Drain, yardstick
from bench.idle import Idle
from bench.startup import Startup
from bench.stats import Series, summarize

Emit = Callable[[str], object]

#: In the labels of what ran against the plain `http.server` servers (`bench.plain`).
PLAIN_LABEL = "plain http.server"
#: The drain of the structured webhook sink into the plain receiver.
PLAIN_DRAIN = f"webhook, structured, {PLAIN_LABEL} receiver"
#: The plain receiver as `http.server` comes (HTTP/1.0: 200 and a body, head and body in
#: two sends, the connection closed after each answer; `bench.plain.ANSWERED`).
ANSWERING_LABEL = f"{PLAIN_LABEL} (HTTP/1.0, 200 with a body)"
ANSWERED_DRAIN = f"webhook, structured, {ANSWERING_LABEL} receiver"
#: How close (ms) the bridge's median part of the latency must come to the vendor sample's.
SAMPLE_MARGIN_MS = 1.0
#: The share of the plain synchronous client's rate the bridge's drain must reach.
SYNC_SHARE = 0.8


@dataclass
class Results:
    mode: str
    seconds: float = 0.0
    #: The commit measured (abbreviated), "+ changes" when the checkout differed from it.
    commit: str | None = None
    #: The host's 1-minute load average when the run began and when it ended (other work
    #: on the machine shows in every figure; 2 cores are busy at 2.0).
    load: list[float] = field(default_factory=list)
    gce: list[Series] = field(default_factory=list)
    azure: list[Series] = field(default_factory=list)
    aws: list[Series] = field(default_factory=list)
    gce_plain: list[Series] = field(default_factory=list)
    azure_plain: list[Series] = field(default_factory=list)
    idle: list[Idle] = field(default_factory=list)
    startup: list[Startup] = field(default_factory=list)
    commit_ms: list[float] = field(default_factory=list)
    #: Milliseconds per fdatasync of a commit's bytes alone, by how they are written
    #: (`bench.drain.disk_floor`): what the disk costs, below the spool.
    disk_ms: dict[str, list[float]] = field(default_factory=dict)
    drains: list[Drain] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    import_profile: tuple[float, list[tuple[float, str]]] = (0.0, [])
    import_profile_sdks: tuple[float, list[tuple[float, str]]] = (0.0, [])
    rss_profile: list[str] = field(default_factory=list)
    drain_profile: list[str] = field(default_factory=list)
    drain_profile_plain: list[str] = field(default_factory=list)
    idle_profile: list[str] = field(default_factory=list)
    #: Per missed latency target (its label): the slowest transitions, then a CPU profile.
    latency_profiles: dict[str, list[str]] = field(default_factory=dict)


def dump(results: Results) -> str:
    """The figures of a run as JSON (results.json), which `load` reads back: what a comparison
    of two revisions collects from each of its runs. NaN (nothing measured) stays NaN."""
    return json.dumps(dataclasses.asdict(results), indent=1)


def load(text: str) -> Results:
    """`Results` from `dump`'s JSON (the same version of this module wrote it)."""
    results = Results(**json.loads(text))
    for key in ("gce", "azure", "aws", "gce_plain", "azure_plain"):
        setattr(results, key, [Series(**item) for item in _objects(getattr(results, key))])
    results.idle = [Idle(**item) for item in _objects(results.idle)]
    results.startup = [Startup(**item) for item in _objects(results.startup)]
    results.drains = [Drain(**item) for item in _objects(results.drains)]
    for key in ("import_profile", "import_profile_sdks"):
        total, ranked = getattr(results, key)
        setattr(results, key, (total, [(ms, name) for ms, name in ranked]))
    return results


def _objects(loaded: object) -> list[dict[str, Any]]:
    """A list field as `json.loads` left it: JSON objects, not yet the dataclasses named."""
    return cast(list[dict[str, Any]], loaded)


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        system = platform.freedesktop_os_release()["PRETTY_NAME"]
    except OSError:
        system = platform.platform()
    return (
        f"{model}, {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}, {system} ({platform.system()} {platform.release()})"
    )


@dataclass
class Target:
    label: str
    value: float | None
    baseline: float | None
    limit: float
    unit: str
    higher_is_better: bool = False

    def verdict(self) -> str:
        if self.value is None or math.isnan(self.value) or math.isnan(self.limit):
            return "not measured"
        if self.higher_is_better:
            ok, margin = self.value > self.limit, self.value - self.limit
        else:
            ok, margin = self.value < self.limit, self.limit - self.value
        share = abs(margin) / self.limit
        if ok:
            return f"PASS ({_fmt(abs(margin), self.unit)} / {share:.0%} to spare)"
        return f"**MISS** by {_fmt(abs(margin), self.unit)} ({share:.0%})"

    def ratio(self) -> str:
        if self.value is None or not self.baseline or math.isnan(self.baseline):
            return "n/a"
        return f"{self.value / self.baseline:.2f}x"

    def missed(self) -> bool:
        return self.verdict().startswith("**MISS")


def _fmt(value: float | None, unit: str) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    if unit == "ev/s":
        return f"{value:,.0f} ev/s"
    if unit == "s/h":
        return f"{value:.2f} s/h"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    if unit == "s":
        return f"{value:.3f} s"
    return f"{value:.2f} {unit}"


def _find(items: list[Series], name: str) -> Series | None:
    return next((s for s in items if s.name.startswith(name)), None)


def targets(results: Results) -> list[Target]:
    def p99_ours(series: Series | None) -> float | None:
        return summarize(series.ours).p99 if series and series.ours else None

    def p50_ours(series: Series | None) -> float | None:
        return summarize(series.ours).p50 if series and series.ours else None

    def near_sample(label: str, ours: Series | None, sample: Series | None) -> Target:
        base = p50_ours(sample)
        limit = math.nan if base is None else base + SAMPLE_MARGIN_MS
        return Target(label, p50_ours(ours), base, limit, "ms")

    gce_ours, gce_base = _find(results.gce, "bridge"), _find(results.gce, "Google")
    az1 = _find(results.azure, "bridge, Azure 1 s")
    az025 = _find(results.azure, "bridge, Azure 0.25 s")
    az_base = _find(results.azure, "Microsoft")
    idle = {i.name: i for i in results.idle}
    start = {s.name: s for s in results.startup}
    drains = {d.name: d for d in results.drains}

    def idle_value(name: str, cpu: bool) -> float | None:
        item = idle.get(name)
        if item is None:
            return None
        return item.cpu_per_hour if cpu else item.peak_rss_mb

    def drain_rate(name: str) -> float | None:
        return drains[name].per_second if name in drains else None

    webhook_rss = idle_value("bridge, GCE, webhook sink", cpu=False)
    sample_rss = idle_value("Google's sample (GCE)", cpu=False)
    no_sdk = start.get("bridge, webhook sink (no cloud SDK)")
    sample_start = start.get("Google's sample (GCE)")

    def share_of_sync(drain: str, receiver: str) -> Target:
        sync = drain_rate(yardstick(SYNC_CLIENT, receiver))
        return Target(f"Backlog drain to a {receiver} receiver (structured), "
                      f"{SYNC_SHARE:.0%} of a plain synchronous client's rate",
                      drain_rate(drain), sync, sync * SYNC_SHARE if sync else math.nan, "ev/s",
                      higher_is_better=True)  # fmt: skip

    near = f"p50, within {SAMPLE_MARGIN_MS:g} ms of"
    return [
        Target("GCE: our part of notice-to-delivery latency, p99", p99_ours(gce_ours),
               p99_ours(gce_base), 20.0, "ms"),
        Target("Azure, 1 s poll: our part of the latency, p99", p99_ours(az1),
               p99_ours(az_base), 20.0, "ms"),
        Target("Azure, 0.25 s poll: our part of the latency, p99", p99_ours(az025),
               p99_ours(az_base), 20.0, "ms"),
        near_sample(f"GCE: our part of the latency, {near} Google's sample", gce_ours, gce_base),
        near_sample(f"GCE, {PLAIN_LABEL}: our part of the latency, {near} Google's sample",
                    _find(results.gce_plain, "bridge"), _find(results.gce_plain, "Google")),
        near_sample(f"Azure, 1 s poll, {PLAIN_LABEL}: our part of the latency, {near} "
                    "Microsoft's sample", _find(results.azure_plain, "bridge, Azure 1 s"),
                    _find(results.azure_plain, "Microsoft")),
        Target("Idle peak RSS, webhook sink only (GCE)", webhook_rss, sample_rss, 30.0, "MiB"),
        Target("Idle CPU, Azure 1 s poll", idle_value("bridge, Azure 1 s, webhook sink", True),
               idle_value("Microsoft's sample (Azure 1 s)", True), 10.0, "s/h"),
        Target("Start-up to first metadata request, no cloud SDK",
               no_sdk.seconds if no_sdk else None,
               sample_start.seconds if sample_start else None, 0.3, "s"),
        Target("Backlog drain, webhook (structured, one event per request)",
               drain_rate("webhook, structured"), None, 2500.0, "ev/s", higher_is_better=True),
        Target("Backlog drain, webhook batch mode (100 events per request)",
               drain_rate("webhook, batch"), None, 2000.0, "ev/s", higher_is_better=True),
        Target("Backlog drain, Kafka sink to librdkafka's mock cluster",
               drain_rate("Kafka mock cluster, binary"), None, 5000.0, "ev/s",
               higher_is_better=True),
        share_of_sync(PLAIN_DRAIN, PLAIN_LABEL),
        share_of_sync(ANSWERED_DRAIN, ANSWERING_LABEL),
    ]  # fmt: skip


def _ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1f}"


def _triple(values: list[float]) -> str:
    s = summarize(values)
    return f"{_ms(s.p50)} / {_ms(s.p99)} / {_ms(s.max)}"


def render(results: Results) -> str:
    out: list[str] = []
    add = out.append
    add("# Benchmark report")
    add("")
    add(f"Machine: {machine()}. Mode: {results.mode}; the suite ran in {results.seconds:.0f} s.")
    add(f"Commit measured: {results.commit or 'unknown (not a git checkout)'}.")
    if results.load:
        loads = " and ".join(f"{value:.1f}" for value in results.load)
        add(f"Load average (1 min) at the start and the end of the run: {loads}.")
    add("Everything on loopback; the bridge, the receiver and each vendor sample are separate")
    add("processes; the simulators run in the driver process.")
    add("")
    add("## Targets")
    add("")
    add("| measure | bridge | vendor sample | ratio | target | verdict |")
    add("| --- | --- | --- | --- | --- | --- |")
    table = targets(results)
    for t in table:
        limit = ("> " if t.higher_is_better else "< ") + _fmt(t.limit, t.unit)
        add(
            f"| {t.label} | {_fmt(t.value, t.unit)} | {_fmt(t.baseline, t.unit)} | "
            f"{t.ratio()} | {limit} | {t.verdict()} |"
        )
    add("")
    add("Ratios are bridge / vendor sample measured in the same run (below 1x the bridge is")
    add("faster or smaller); for the drain into the plain receiver, bridge / plain synchronous")
    add("client. The samples only print what they see; the bridge also commits each event to")
    add("its SQLite spool, fsyncs it (before the dispatcher is woken) and POSTs it to a")
    add("webhook. Rows marked plain http.server ran against Python's `http.server` as the")
    add("metadata server and the webhook receiver (it writes an answer's head and body")
    add("separately, as many real servers do); the others against our aiohttp simulator and")
    add("receiver (one write per answer).")
    add("")
    _latency(results, add)
    _process(results, add)
    _drain(results, add)
    _profiles(results, table, add)
    if results.skipped:
        add("## Not measured in this run")
        add("")
        out.extend(f"- {reason}" for reason in results.skipped)
        add("")
    return "\n".join(out)


def _latency(results: Results, emit: Emit) -> None:
    emit("## Notice-to-delivery latency (ms: p50 / p99 / max)")
    emit("")
    emit("| watcher | transitions | total | poll wait | our part (total - poll wait) |")
    emit("| --- | --- | --- | --- | --- |")
    for series in _all_series(results):
        got = f"{len(series.total)} of {series.expected}"
        emit(
            f"| {series.name} | {got} | {_triple(series.total)} | {_triple(series.wait)} | "
            f"{_triple(series.ours)} |"
        )
    emit("")
    emit("Total: from `time.monotonic()` taken right before the simulator applies the change")
    emit("(in the driver, on the simulator's own event loop) to the moment the receiver")
    emit("process has read the whole POST body (for the samples: the moment they print the")
    emit("notice). Poll wait: from the change to the moment the simulator handed its first")
    emit("answer carrying it to the HTTP server. Our part = total - poll wait: the watcher's")
    emit("reading and parsing, the diff, the spool commit, the dispatcher and the webhook")
    emit("POST (the commit, its fsync and the waiting dispatcher's read are one call on the")
    emit("spool's thread); for the samples,")
    emit("reading, parsing and printing. CLOCK_MONOTONIC is one clock for all processes of")
    emit("a Linux host. Azure transitions are adds and")
    emit("removals of events at random moments (about two per second), so several can share")
    emit("one poll; all Azure watchers saw the same sequence. AWS transitions are a Spot")
    emit("interruption notice appearing and going away (bench/aws.py). Plot: `latency.png`.")
    emit("")
    emit(f"Rows marked ({PLAIN_LABEL}): the same, with Python's `http.server` (HTTP/1.1,")
    emit("keep-alive, Nagle on, head and body written in two sends) in front of each simulator")
    emit("and as the webhook receiver (`bench/plain.py`); the poll wait ends when the plain")
    emit("server writes the answer's head, so the forwarding hop counts as poll wait. The")
    emit("Azure run against the plain servers plays fewer transitions, to keep the suite short.")
    emit("")


def _process(results: Results, emit: Emit) -> None:
    emit("## Footprint and idle cost")
    emit("")
    emit("| process (idle, no notices) | peak RSS | CPU while idle |")
    emit("| --- | --- | --- |")
    for item in results.idle:
        cpu = _fmt(item.cpu_per_hour, "s/h") if item.cpu_per_hour is not None else "—"
        emit(f"| {item.name} | {item.peak_rss_mb:.1f} MiB | {cpu} |")
    emit("")
    emit("Peak RSS is the kernel's high-water mark (VmHWM) over the process's life; CPU is")
    emit("user + system time over the idle window, scaled to an hour. The Pub/Sub client is")
    emit("created at the first publish, so an idle bridge with that sink has not loaded it.")
    emit("")
    emit("## Start-up (spawn to first metadata request, median)")
    emit("")
    emit("| process | median | runs |")
    emit("| --- | --- | --- |")
    for start in results.startup:
        runs = ", ".join(f"{r:.3f}" for r in start.runs)
        emit(f"| {start.name} | {start.seconds:.3f} s | {runs} |")
    emit("")
    emit(
        "Every bridge here runs with its HTTP listener on (the default): /metrics, the probes "
        "and the status API are part of each figure."
    )
    emit("")


def _drain(results: Results, emit: Emit) -> None:
    emit("## Spool and backlog drain")
    emit("")
    commit = summarize(results.commit_ms)
    emit("| measure | value |")
    emit("| --- | --- |")
    emit(
        f"| spool commit per notice (one event + checkpoint, until fsynced), p50 / p99 | "
        f"{commit.p50:.2f} ms / {commit.p99:.2f} ms |"
    )
    if results.disk_ms:
        floor = {how: summarize(values).p50 for how, values in results.disk_ms.items()}
        emit(
            f"| the disk alone: fdatasync of a commit's bytes, p50, "
            f"{' / '.join(floor)} | {' / '.join(f'{ms:.2f} ms' for ms in floor.values())} |"
        )
    for item in results.drains:
        rate = f"{item.per_second:,.0f} ev/s"
        if item.name.startswith((SYNC_CLIENT, HTTP1_ALONE)):
            emit(f"| yardstick: {item.events:,} events, one per request, by {item.name} "
                 f"| {rate} |")  # fmt: skip
        else:
            emit(f"| backlog drain: {item.events:,} events to {item.name} | {rate} |")
    emit("")
    emit(f"The {PLAIN_LABEL} receiver answers each webhook `204 No Content` (a head, no")
    emit("body) on a kept connection. The one marked HTTP/1.0 is `http.server` as it comes:")
    emit("`200 OK` and a short JSON body, the head and the body in two sends, the connection")
    emit("closed after each answer (so every request pays a new connection). The yardsticks")
    emit("POST the same structured events to the same receivers, serialized up front, with")
    emit("no spool, no dispatcher and no retries behind them: a plain synchronous client (what")
    emit("one request costs at the least), then the bridge's own HTTP client alone (what of")
    emit("the drain's cost is the client's, and what is the rest of the bridge's).")
    emit("")


def _profiles(results: Results, table: list[Target], emit: Emit) -> None:
    missed = [t for t in table if t.missed()]
    emit("## What costs it (profiles for the missed targets)")
    emit("")
    if not missed:
        emit("Every target was met.")
        emit("")
        return
    for t in missed:
        emit(f"### {t.label}: {t.verdict()}")
        emit("")
        emit("```")
        if "RSS" in t.label:
            emit("resident memory added by each import of the run path (MiB, fresh interpreter):")
            for line in results.rss_profile:
                emit(f"  {line}")
        elif "Start-up" in t.label:
            total, ranked = results.import_profile
            emit(f"python -X importtime of the run path: {total:.0f} ms of imports; costliest:")
            for ms, name in ranked:
                emit(f"  {ms:7.1f} ms  {name}")
            total, ranked = results.import_profile_sdks
            emit(f"with the cloud SDKs: {total:.0f} ms; costliest:")
            for ms, name in ranked[:5]:
                emit(f"  {ms:7.1f} ms  {name}")
        elif PLAIN_LABEL in t.label and "drain" in t.label:
            rates = {d.name: d.per_second for d in results.drains}
            receiver = ANSWERING_LABEL if ANSWERING_LABEL in t.label else PLAIN_LABEL
            if t.baseline and yardstick(HTTP1_ALONE, receiver) in rates:
                alone = rates[yardstick(HTTP1_ALONE, receiver)]
                emit(
                    f"the bridge's HTTP client alone, same events and receiver: {alone:,.0f} "
                    f"ev/s ({alone / t.baseline:.0%} of the synchronous client); the rest of"
                )
                emit("the gap is the dispatcher, the spool and the sink (see the profile)")
                emit("")  # fmt: skip
            for line in results.drain_profile_plain if receiver == PLAIN_LABEL else []:
                emit(line)
        elif "drain" in t.label:
            for line in results.drain_profile:
                emit(line)
        elif t.label in results.latency_profiles:
            for line in results.latency_profiles[t.label]:
                emit(line)
        elif "Idle CPU" in t.label:
            emit("the idle Azure bridge under cProfile (start-up included, so read the per-poll")
            emit("figures as an upper bound):")
            for line in results.idle_profile:
                emit(line)
        else:
            emit("no profile collected for this measure")
        emit("```")
        emit("")


def _all_series(results: Results) -> list[Series]:
    return [*results.gce, *results.azure, *results.aws, *results.gce_plain, *results.azure_plain]


def plot(results: Results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [s for s in _all_series(results) if s.total]
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for s in series:
        style = (
            ("-." if s.baseline else ":")
            if PLAIN_LABEL in s.name
            else ("--" if s.baseline else "-")
        )
        for axis, values in ((left, s.total), (right, s.ours)):
            ordered = sorted(max(v, 1e-3) for v in values)
            fraction = [(i + 1) / len(ordered) for i in range(len(ordered))]
            axis.step(ordered, fraction, style, where="post", label=s.name)
    left.set_title("Notice-to-delivery latency (change → consumer holds it)")
    right.set_title("Our part: total - poll wait")
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_xlabel("milliseconds (log scale)")
        axis.set_ylabel("fraction of transitions")
        axis.grid(True, which="both", alpha=0.3)
    right.axvline(20.0, color="red", linewidth=1, alpha=0.6, label="target p99 < 20 ms")
    right.legend(fontsize=8, loc="lower right")
    figure.suptitle(f"maintenance-bridge vs. the vendors' samples — {machine()}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
