"""`python -m bench.compare BEFORE [AFTER]`: the sidecar benchmarks of two revisions, side by
side in one run, and bench/results/compare.md (each figure before and after, and its ratio).

BEFORE (and AFTER, when given; by default AFTER is this working tree, changes included) is
checked out with `git worktree add --detach` into a temporary directory, removed afterwards.
Each part of the suite (`python -m bench --parts`: the GCE latency, the idle cost, the
webhook drains, ...) then runs for both revisions in turn (before, after, before, after:
a change in the machine's load hits both alike), each run its own process started from that
revision's checkout with it first on PYTHONPATH (one virtual environment serves both: the
dependencies are the same; the child refuses to run if `bridge` comes from another tree).
With `--repeat N` each part runs N times per revision and the report gives the medians.

What is measured is each revision's own: its `bridge` and `sinks`, and its benchmark modules
(bench/latency.py, drain.py, ...), which drive its code through its own internal interfaces.
Only the driver, `bench/__main__.py` and `bench/report.py` (which run one part and write its
figures as JSON), is copied from this checkout into the other revision's, since an older one
cannot run a single part or write JSON.

A figure is marked when the after value is worse by more than 10 % in its bad direction
(latency, memory, CPU and start-up up; rates down). The vendors' samples and the plain
synchronous client are the same code on both sides: their change is this run's noise.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.__main__ import PARTS, parse_args, sizes_of
from bench.drain import SYNC_CLIENT
from bench.procs import ROOT
from bench.report import Results, load, machine
from bench.stats import summarize

#: The driver files copied into a checked-out revision (see the module's docstring).
DRIVER = ("bench/__main__.py", "bench/report.py")
#: How much worse (a share of the before value) a figure may get before it is marked.
TOLERANCE = 0.10


@dataclass(frozen=True)
class Figure:
    name: str
    unit: str
    value: float
    higher_is_better: bool = False
    #: The same code on both sides (a vendor's sample, a plain client): the machine's noise.
    control: bool = False


def figures(results: Results) -> list[Figure]:
    """Every figure of a run that a change of the code could move, in the report's order."""
    found: list[Figure] = []
    for series in [*results.gce, *results.azure, *results.aws, *results.gce_plain,
                   *results.azure_plain]:  # fmt: skip
        ours = summarize(series.ours)
        for label, value in (("p50", ours.p50), ("p99", ours.p99)):
            found.append(Figure(f"{series.name}: our part of the latency, {label}", "ms",
                                value, control=series.baseline))  # fmt: skip
    for item in results.idle:
        found.append(Figure(f"{item.name}: idle peak RSS", "MiB", item.peak_rss_mb,
                            control=item.baseline))  # fmt: skip
        if item.cpu_per_hour is not None:
            found.append(Figure(f"{item.name}: idle CPU", "s/h", item.cpu_per_hour,
                                control=item.baseline))  # fmt: skip
    for start in results.startup:
        found.append(Figure(f"{start.name}: start-up, median", "s", start.seconds,
                            control=start.baseline))  # fmt: skip
    if results.commit_ms:
        commit = summarize(results.commit_ms)
        found.append(Figure("spool commit per notice, p50", "ms", commit.p50))
        found.append(Figure("spool commit per notice, p99", "ms", commit.p99))
    for drain in results.drains:
        found.append(Figure(f"backlog drain: {drain.name}", "ev/s", drain.per_second,
                            higher_is_better=True,
                            control=drain.name.startswith(SYNC_CLIENT)))  # fmt: skip
    return found


@dataclass(frozen=True)
class Side:
    label: str
    #: The checkout its runs start from.
    tree: Path
    #: What it is, for the report: a commit, or this working tree.
    names: str


@dataclass
class Run:
    """One child process: one part, one revision."""

    side: str
    part: str
    seconds: float
    load: tuple[float, float]
    results: Results | None = None
    error: str | None = None


@dataclass
class Comparison:
    before: Side
    after: Side
    mode: str
    sizes: str
    runs: list[Run] = field(default_factory=list)
    seconds: float = 0.0


def git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"bench.compare: git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def describe(commit: str) -> str:
    """`abc1234 (subject)` for a commit, a long subject cut short."""
    short, _, subject = git("log", "-1", "--format=%h %s", commit).partition(" ")
    return f"{short} ({subject[:77] + '...' if len(subject) > 80 else subject})"


@contextmanager
def checked_out(commit: str, scratch: Path, label: str) -> Iterator[Path]:
    """`commit` in a detached worktree under `scratch`, with this checkout's driver files;
    the worktree is removed (and pruned from git's list) however the comparison ends."""
    tree = scratch / label
    git("worktree", "add", "--detach", "--quiet", str(tree), commit)
    try:
        for name in DRIVER:
            shutil.copyfile(ROOT / name, tree / name)
        yield tree
    finally:
        removed = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
            capture_output=True,
            check=False,
        )
        if removed.returncode != 0:
            shutil.rmtree(tree, ignore_errors=True)
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)


def load_average() -> float:
    try:
        return float(psutil.getloadavg()[0])
    except OSError:
        return math.nan


def run_part(side: Side, part: str, size_args: Sequence[str], out: Path) -> Run:
    """`python -m bench --parts PART --json OUT` from `side`'s checkout, that checkout first
    on PYTHONPATH (the child checks that `bridge` is imported from it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(side.tree), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    command = [sys.executable, "-m", "bench", "--parts", part, "--json", str(out), *size_args]
    print(f"[compare] {part}, {side.label}", file=sys.stderr, flush=True)
    before_load, started = load_average(), time.monotonic()
    done = subprocess.run(command, cwd=side.tree, env=env, check=False)
    seconds, load_after = time.monotonic() - started, load_average()
    run = Run(side.label, part, seconds, (before_load, load_after))
    if done.returncode != 0 or not out.exists():
        run.error = f"exit status {done.returncode} (its output is above)"
    else:
        run.results = load(out.read_text())
    return run


def compare(
    before: Side, after: Side, parts: Sequence[str], repeat: int, size_args: Sequence[str],
    scratch: Path,
) -> Comparison:  # fmt: skip
    sizes = sizes_of(parse_args(list(size_args)))
    quick = "--quick" in size_args
    mode = (
        "quick (tiny sizes: the figures say the comparison runs, nothing more)" if quick else "full"
    )
    result = Comparison(before, after, mode, _sizes_text(sizes))
    began = time.monotonic()
    for part in parts:
        for n in range(repeat):
            for side in (before, after):
                out = scratch / "figures" / f"{part}-{side.label}-{n}.json"
                result.runs.append(run_part(side, part, size_args, out))
    result.seconds = time.monotonic() - began
    return result


def _sizes_text(sizes: object) -> str:
    fields = getattr(sizes, "__dataclass_fields__", {})
    return ", ".join(f"{name} {getattr(sizes, name)}" for name in fields)


@dataclass
class Row:
    figure: Figure
    before: float
    after: float

    @property
    def change(self) -> float:
        """after / before - 1 (NaN where either is missing or before is 0)."""
        if math.isnan(self.before) or math.isnan(self.after) or self.before == 0:
            return math.nan
        return self.after / self.before - 1

    def worse(self) -> bool:
        change = self.change
        if math.isnan(change):
            return False
        # rounded: 4.4 against 4.0 is 10 % exactly, not 10.0000000000001 %
        change = round(change, 9)
        return change < -TOLERANCE if self.figure.higher_is_better else change > TOLERANCE


def rows(comparison: Comparison) -> list[Row]:
    """Per figure, the median over the repeated runs of each side."""
    values: dict[str, dict[str, list[float]]] = {}
    kinds: dict[str, Figure] = {}
    for run in comparison.runs:
        for figure in figures(run.results) if run.results else []:
            kinds.setdefault(figure.name, figure)
            sides = values.setdefault(figure.name, {})
            if not math.isnan(figure.value):
                sides.setdefault(run.side, []).append(figure.value)

    def median(name: str, side: str) -> float:
        found = values[name].get(side, [])
        return statistics.median(found) if found else math.nan

    return [Row(kinds[name], median(name, comparison.before.label),
                median(name, comparison.after.label)) for name in kinds]  # fmt: skip


def _value(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    if unit == "ev/s":
        return f"{value:,.0f} ev/s"
    if unit == "s":
        return f"{value:.3f} s"
    return f"{value:.2f} {unit}"


def _ratio(row: Row) -> str:
    change = row.change
    return "n/a" if math.isnan(change) else f"{change + 1:.2f}x ({change:+.0%})"


def _table(table: list[Row], out: list[str]) -> None:
    out.append("| figure | before | after | after / before | worse by > 10 % |")
    out.append("| --- | --- | --- | --- | --- |")
    for row in table:
        unit = row.figure.unit
        direction = "higher is better" if row.figure.higher_is_better else "lower is better"
        mark = "**WORSE**" if row.worse() else ""
        out.append(
            f"| {row.figure.name} ({direction}) | {_value(row.before, unit)} | "
            f"{_value(row.after, unit)} | {_ratio(row)} | {mark} |"
        )
    out.append("")


def render(comparison: Comparison) -> str:
    before, after = comparison.before, comparison.after
    table = rows(comparison)
    ours = [row for row in table if not row.figure.control]
    controls = [row for row in table if row.figure.control]
    worse = [row for row in ours if row.worse()]
    loads = [value for run in comparison.runs for value in run.load if not math.isnan(value)]
    repeat = max((sum(r.part == p and r.side == before.label for r in comparison.runs)
                  for p in {r.part for r in comparison.runs}), default=0)  # fmt: skip
    out = [
        "# Benchmarks before and after",
        "",
        f"Before: {before.names}.  ",
        f"After: {after.names}.  ",
        f"Machine: {machine()}. Mode: {comparison.mode}; {len(comparison.runs)} runs in "
        f"{comparison.seconds:.0f} s, each part {repeat} time(s) per revision, the two "
        "revisions in turn (before, after, before, after, ...), each run its own process.  ",
        f"Sizes: {comparison.sizes}.",
    ]
    if loads:
        out.append(
            f"Load average (1 min) around the runs: min {min(loads):.2f}, median "
            f"{statistics.median(loads):.2f}, max {max(loads):.2f} (2 cores are busy at 2.0; "
            "other work on the machine shows in every figure)."
        )
    out += ["", "## Summary", ""]
    if worse:
        out.append(f"{len(worse)} figure(s) of the bridge worse by more than "
                   f"{TOLERANCE:.0%} after:")  # fmt: skip
        out += [f"- {row.figure.name}: {_ratio(row)}" for row in worse]
    else:
        out.append(f"No figure of the bridge is worse by more than {TOLERANCE:.0%} after.")
    failed = [run for run in comparison.runs if run.error]
    if failed:
        out.append("")
        out.append("Runs that failed (their figures are missing above):")
        out += [f"- {run.part}, {run.side}: {run.error}" for run in failed]
    out += ["", "## The bridge's figures (medians of the repeated runs)", ""]
    _table(ours, out)
    out += [
        "## The same code on both sides (the machine's noise in this run)",
        "",
        "The vendors' samples and the plain synchronous client do not change between the",
        "revisions: how far their figures moved is how far this machine's noise moves a figure.",
        "",
    ]
    _table(controls, out)
    out += ["## The runs", "", "| part | revision | seconds | load at start / end |",
            "| --- | --- | --- | --- |"]  # fmt: skip
    for run in comparison.runs:
        status = f" (failed: {run.error})" if run.error else ""
        out.append(f"| {run.part} | {run.side}{status} | {run.seconds:.1f} | "
                   f"{run.load[0]:.2f} / {run.load[1]:.2f} |")  # fmt: skip
    out.append("")
    return "\n".join(out)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("before", metavar="BEFORE", help="the revision before (a commit)")
    parser.add_argument(
        "after", metavar="AFTER", nargs="?", help="the revision after (default: this working tree)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks it runs")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each part per revision")
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        metavar="NAME,...",
        help=f"the parts to compare (default: all of {', '.join(PARTS)})",
    )
    parser.add_argument("--transitions", type=int, help="latency transitions per cloud")
    parser.add_argument("--drain-events", type=int, help="events in each backlog drain")
    parser.add_argument("--idle-seconds", type=float, help="length of the idle window")
    parser.add_argument("--no-pubsub", action="store_true", help="skip the Pub/Sub drain")
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "bench" / "results" / "compare.md",
        help="the report (default: bench/results/compare.md)",
    )
    args = parser.parse_args(argv)
    args.parts = [name.strip() for name in args.parts.split(",") if name.strip()]
    unknown = [name for name in args.parts if name not in PARTS]
    if unknown or not args.parts:
        parser.error(f"unknown part(s) {', '.join(unknown) or '(none)'}; the parts: "
                     f"{', '.join(PARTS)}")  # fmt: skip
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def size_args(args: argparse.Namespace) -> list[str]:
    """The options of `python -m bench` that set the sizes, as given here."""
    given = ["--quick"] if args.quick else []
    for option in ("transitions", "drain_events", "idle_seconds"):
        if getattr(args, option) is not None:
            given += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
    return given + (["--no-pubsub"] if args.no_pubsub else [])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    before_commit = git("rev-parse", "--verify", f"{args.before}^{{commit}}")
    after_commit = git("rev-parse", "--verify", f"{args.after}^{{commit}}") if args.after else None
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as directory:
        scratch = Path(directory)
        with checked_out(before_commit, scratch, "before") as before_tree:
            before = Side("before", before_tree, describe(before_commit))
            if after_commit is None:
                head = describe("HEAD")
                dirty = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD"],
                                       check=False).returncode  # fmt: skip
                after = Side("after", ROOT, f"this working tree, {head}"
                             + (" + uncommitted changes" if dirty else ""))  # fmt: skip
                comparison = compare(before, after, args.parts, args.repeat, size_args(args),
                                     scratch)  # fmt: skip
            else:
                with checked_out(after_commit, scratch, "after") as after_tree:
                    after = Side("after", after_tree, describe(after_commit))
                    comparison = compare(before, after, args.parts, args.repeat,
                                         size_args(args), scratch)  # fmt: skip
    report = render(comparison)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)
    print(f"[compare] wrote {args.out}", file=sys.stderr)
    return 1 if any(run.error for run in comparison.runs) else 0


if __name__ == "__main__":
    sys.exit(main())
