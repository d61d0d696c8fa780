"""Versions that name a build: the release, plus the commit a build from a git checkout was
made from (`0.2.0+g1a2b3c4`); `--version`, heartbeats, the `User-Agent` and the info metric
carry it. A build without git (the container build) is the plain release.

The wheel tests build real wheels with pip (setup.py's hook runs as in any build); they need
the package index for the build requirements and skip without it, except under `CI=true`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from bridge import contract
from bridge.infra import platform as platforms
from bridge.infra.buildinfo import (
    RELEASE,
    build_module,
    git_commit,
    user_agent,
    version,
    with_commit,
)
from bridge.surface.about import describe

ROOT = Path(__file__).resolve().parent.parent


def head() -> str | None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip()[:7] if done.returncode == 0 else None


def test_the_release_is_a_semantic_version_and_a_build_adds_a_pep440_local_label() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", RELEASE)
    assert with_commit("1.3.0", "1a2b3c4") == "1.3.0+g1a2b3c4"
    assert with_commit("1.3.0", None) == "1.3.0"
    assert Version(with_commit(RELEASE, "1a2b3c4")).local == "g1a2b3c4"
    assert Version(with_commit(RELEASE, "1a2b3c4")).public == RELEASE


def test_a_checkout_names_its_commit() -> None:
    commit = head()
    if commit is None:
        pytest.skip("not a git checkout (or no git): the plain release is right")
    assert version() == f"{RELEASE}+g{commit}"
    assert user_agent() == f"maintenance-bridge/{RELEASE}+g{commit}"


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_the_commit_is_read_from_every_layout_git_writes(tmp_path: Path) -> None:
    """Loose and packed refs, a detached HEAD, a linked worktree (a `.git` file), no git:
    made by the real git, read without it."""
    if shutil.which("git") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("git is not installed")
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(
        repo,
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.invalid",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "first",
    )
    first = _git(repo, "rev-parse", "HEAD")
    assert git_commit(repo) == first[:7]  # a loose ref
    _git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert git_commit(repo) == first[:7]  # packed
    _git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "linked"))
    assert (tmp_path / "linked" / ".git").is_file()
    assert git_commit(tmp_path / "linked") == first[:7]  # a worktree, detached
    _git(repo, "checkout", "-q", "--detach")
    assert git_commit(repo) == first[:7]
    assert git_commit(tmp_path) is None  # not a checkout
    (tmp_path / ".git").write_text("not a pointer\n")
    assert git_commit(tmp_path) is None


def test_version_prints_the_build_the_schema_and_the_platform() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "--version"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"maintenance-bridge {version()}"
    assert lines[1] == f"event schema {contract.SCHEMA_VERSION} ({contract.SCHEMA_URI})"
    assert lines[2].startswith(f"platform {platforms.name()} ")
    assert done.stdout == describe()


def _wheel(source: Path, out: Path) -> zipfile.ZipFile:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"pip wheel failed: {done.stderr[-2000:]}")
        pytest.skip(f"cannot build a wheel here (package index?): {done.stderr[-300:]}")
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


@pytest.mark.slow
def test_a_wheel_built_from_the_checkout_names_its_commit(tmp_path: Path) -> None:
    commit = head()
    if commit is None:
        pytest.skip("not a git checkout")
    # A copy of the checkout's files pointing at its .git: pip builds it as it would the
    # checkout itself, and the checkout's own build/ directory stays untouched.
    tree = tmp_path / "src"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        target = tree / name.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name.decode()).is_file():
            shutil.copy2(ROOT / name.decode(), target)
    (tree / ".git").write_text(f"gitdir: {_git_dir()}\n")
    with _wheel(tree, tmp_path / "dist") as wheel:
        generated = wheel.read("bridge/_build.py").decode()
    assert generated == build_module(commit)
    assert not (ROOT / "bridge" / "_build.py").exists()  # never in the sources


def _git_dir() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--absolute-git-dir"], cwd=ROOT, check=True, capture_output=True
    )
    return done.stdout.decode().strip()


@pytest.mark.slow
def test_the_container_build_without_git_is_the_plain_release(tmp_path: Path) -> None:
    # What the Dockerfile copies (tests/test_deploy.py pins that list): no .git, no setup.py.
    tree = tmp_path / "src"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    for package in ("bridge", "sinks"):
        shutil.copytree(
            ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    with _wheel(tree, tmp_path / "dist") as wheel:
        assert "bridge/_build.py" not in wheel.namelist()
        wheel.extractall(tmp_path / "site")
    done = subprocess.run(
        [sys.executable, "-c", "from bridge.infra.buildinfo import version; print(version())"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == RELEASE


async def test_the_webhook_sink_and_the_metadata_watchers_say_which_build_calls(
    tmp_path: Path,
) -> None:
    """The `User-Agent` of the webhook sink (what the fleet sees) and of the metadata
    requests."""
    from bridge.simulator import Simulator
    from tests.factories import sample_events
    from tests.sinks.test_webhook import make_sink
    from tests.sinks.webhook_receiver import WebhookReceiver
    from tests.support import eventually, running_bridge

    receiver = await WebhookReceiver().start()
    sink = make_sink(receiver.url)
    try:
        await sink.publish(sample_events(1))
        (request,) = receiver.posts()
    finally:
        await sink.close(1.0)
        await receiver.stop()
    assert request.headers["user-agent"] == user_agent() == f"maintenance-bridge/{version()}"

    async with Simulator("gce") as sim, running_bridge(sim, tmp_path) as run:
        await eventually(run.watching)
        await eventually(lambda: len(sim.requests) >= 3)
    agents = {
        value
        for record in sim.requests
        for key, value in record.headers.items()
        if key.lower() == "user-agent"
    }
    assert agents == {user_agent()}


def test_the_changelog_has_a_dated_section_with_upgrade_notes_for_this_release() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert sections[0] == "Unreleased"  # where the next release's bullets go
    assert re.fullmatch(rf"{re.escape(RELEASE)} - \d{{4}}-\d{{2}}-\d{{2}}", sections[1])
    this = text.split(f"## {sections[1]}\n", 1)[1].split("\n## ", 1)[0]
    assert "### Upgrade notes" in this


def test_the_docs_show_the_version_scheme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    for text in (readme, operations):
        assert re.search(r"\d+\.\d+\.\d+\+g[0-9a-f]{7}", text)
    assert "## Rolling out" in operations
    for part in ("### Waves", "### Watching the versions", "### Rollback", "pip-audit"):
        assert part in operations.split("## Rolling out", 1)[1]
