"""The sidecar's run path never loads the fleet side, and reading an event needs little."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _loaded(code: str) -> list[str]:
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def test_what_run_imports_does_not_load_the_fleet_package() -> None:
    loaded = _loaded(
        "import bridge.cli, bridge.runner, bridge.surface.routes, bridge.surface.health\n"
        "import bridge.pipeline.heartbeat\n"
        "from bridge.cli import build_parser\n"
        "build_parser()\n"
        "from bridge.config import parse_config\n"
        "from bridge.runner import build_sinks\n"
        "build_sinks(parse_config({'sinks': [{'type': 'webhook', 'url': 'http://x/'}]}))\n"
    )
    assert [m for m in loaded if m.startswith("bridge.fleet")] == []


def test_reading_an_event_needs_neither_http_nor_retry_libraries() -> None:
    loaded = _loaded("from bridge.contract import from_cloudevent\n")
    heavy = [m for m in loaded if m.split(".")[0] in ("aiohttp", "h11", "tenacity", "cloudevents")]
    assert heavy == []
