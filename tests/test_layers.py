"""The import rules between the packages (docs/architecture.md), checked on the sources.

Every `import` and `from ... import` in `bridge/` and `sinks/` is read with `ast`, including the
lazy ones inside functions (they are real dependencies, only deferred); imports under
`if TYPE_CHECKING:` are left out (annotations only, no run-time edge). Each module belongs to
one layer, and a layer may import only the layers listed for it: the flow goes one way, from
the entry points down to the infrastructure, and `bridge` and `sinks` meet at `sinks.api` and
`sinks.registry` only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The layers, from the bottom. A module's layer is the longest prefix listed here.
LAYERS: dict[str, str] = {
    "bridge": "root",  # bridge/__init__.py: the version only
    "bridge.contract": "contract",
    "bridge.infra": "infra",
    "bridge.schemas": "infra",
    "sinks": "sinks",
    "sinks.api": "sinks-api",
    "sinks.registry": "sinks-api",
    "bridge.config": "config",
    "bridge.pipeline": "pipeline",
    "bridge.providers": "providers",
    # Names each provider's parts by module; the configuration and the simulator read it.
    "bridge.providerapi": "registry",
    "bridge.actions": "actions",
    "bridge.runner": "runner",
    "bridge.compose": "runner",
    "bridge.surface": "surface",
    "bridge.simulator": "simulator",
    "bridge.fleet": "fleet",
    "bridge.cli": "entry",
    "bridge.service": "entry",
    "bridge.__main__": "entry",
}

# What each layer may import (besides itself and `root`).
ALLOWED: dict[str, set[str]] = {
    "root": set(),
    "contract": set(),
    "infra": set(),
    "registry": {"contract", "infra"},
    "sinks-api": {"infra", "sinks"},
    "sinks": {"infra", "sinks-api"},
    "config": {"infra", "contract", "sinks-api", "registry"},
    "pipeline": {"infra", "contract", "config", "sinks-api"},
    "providers": {"infra", "contract", "config", "pipeline"},
    "actions": {"infra", "contract", "config", "pipeline", "providers"},
    "runner": {"infra", "contract", "config", "pipeline", "providers", "actions", "sinks-api"},
    "surface": {
        *("infra", "contract", "config", "pipeline", "providers", "actions", "runner"),
        "sinks-api",
    },
    "simulator": {"infra", "contract", "registry"},
    # The fleet service verifies webhook signatures with the webhook sink's own code.
    "fleet": {"infra", "contract", "config", "sinks-api", "sinks", "surface", "runner", "pipeline"}
    | {"simulator", "entry"},
    "entry": {
        *("infra", "contract", "config", "pipeline", "providers", "actions", "runner"),
        *("surface", "simulator", "fleet", "sinks-api", "sinks"),
    },
}

# Every layer from the configuration up may read the provider registry.
for _layer in ("pipeline", "providers", "actions", "runner", "surface", "fleet", "entry"):
    ALLOWED[_layer].add("registry")

# Named exceptions, each with its reason.
EXCEPTIONS: dict[tuple[str, str], str] = {
    # The configuration declares each section's model; the coordination section's lives with
    # the coordination engine that reads it (its settings module imports only the infra).
    ("bridge.config", "bridge.actions.coordination.settings"): "a config section's model",
    # The Windows service host is the top of a Windows process, and lives in the platform
    # layer because only that layer may import pywin32 (tests/test_platform.py).
    ("bridge.infra.platform.winservice", "bridge.service"): "the Windows service host",
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["bridge", "providers"] and len(parts) > 3:
        # A provider's folder holds its part of two lower layers: its `[source.<name>]`
        # model (`settings`) belongs to the configuration and its simulated metadata service
        # (`simulated/`) to the simulator; each reads them through the registry.
        if parts[3] == "settings":
            return "config"
        if parts[3] == "simulated":
            return "simulator"
    for n in range(len(parts), 0, -1):
        found = LAYERS.get(".".join(parts[:n]))
        if found is not None:
            return found
    return None


def imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(source)
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(child) for child in ast.walk(node))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from bridge import x` imports the module bridge.x when x is one.
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def violations(module: str, source: str) -> list[str]:
    mine = layer_of(module)
    assert mine is not None, f"{module} belongs to no layer: add it to LAYERS"
    found = []
    for line, target in imports(source):
        if target.split(".")[0] not in ("bridge", "sinks"):
            continue
        theirs = layer_of(target)
        if theirs in (None, mine, "root"):
            continue
        if theirs in ALLOWED[mine]:
            continue
        if any(module == a and target.startswith(b) for a, b in EXCEPTIONS):
            continue
        found.append(f"{module}:{line}: {mine} may not import {target} ({theirs})")
    return found


def _sources() -> list[tuple[str, str]]:
    return [
        (_module(path), path.read_text(encoding="utf-8"))
        for top in ("bridge", "sinks")
        for path in sorted((ROOT / top).rglob("*.py"))
    ]


def test_every_import_follows_the_layers() -> None:
    sources = _sources()
    assert len(sources) > 100
    assert [v for module, source in sources for v in violations(module, source)] == []


def test_the_rule_sees_what_it_forbids() -> None:
    source = (
        "from bridge.surface import metrics\n"
        "def later():\n    from bridge.runner import Bridge\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from bridge.actions.engine import Actions\n"
    )
    assert [v.split(": ", 1)[1] for v in violations("bridge.pipeline.spool", source)] == [
        "pipeline may not import bridge.surface.metrics (surface)",
        "pipeline may not import bridge.runner.Bridge (runner)",
    ]


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("bridge.providers.gce.watcher", "providers"),
        ("bridge.providers.gce.settings", "config"),
        ("bridge.providerapi.registry", "registry"),
        ("bridge.providers.aws.simulated.http", "simulator"),
        ("sinks.webhook", "sinks"),
        ("sinks.api", "sinks-api"),
        ("bridge.infra.platform.posix", "infra"),
    ],
)
def test_a_module_belongs_to_the_layer_of_its_longest_prefix(module: str, layer: str) -> None:
    assert layer_of(module) == layer


def test_sinks_reach_the_bridge_only_through_the_plugin_surface_and_the_infra() -> None:
    """A sink plug-in imports `sinks.api` (and may use the shared infrastructure); the
    pipeline, actions and surface are not its business. So `bridge` and `sinks` have no
    import cycle: `sinks` needs only `bridge.infra`, which imports nothing of either."""
    for module, source in _sources():
        if module.startswith("bridge.infra"):
            assert not [t for _, t in imports(source) if t.startswith("sinks")], module
        if module.startswith("sinks"):
            bridge_side = {layer_of(t) for _, t in imports(source) if t.startswith("bridge.")}
            assert bridge_side <= {"infra"}, (module, bridge_side)


def test_the_contract_reads_events_without_the_sidecars_dependencies() -> None:
    """A consumer imports `bridge.contract` to read our events: no HTTP client, no retry
    library, no other bridge module."""
    source = (ROOT / "bridge" / "contract.py").read_text(encoding="utf-8")
    tops = {t.split(".")[0] for _, t in imports(source)}
    assert not tops & {"aiohttp", "h11", "tenacity", "sinks"}
    assert not [t for _, t in imports(source) if t.startswith("bridge.")]


def test_the_provider_registry_lists_the_contracts_providers() -> None:
    """One source of truth: the registry's names are the contract's `ProviderName`, and every
    registered provider loads and says its own name."""
    from bridge.providerapi import registry
    from bridge.providers import plugins

    registry._check()
    assert [plugins.get(name).name for name in registry.names()] == list(registry.names())


def test_the_schema_version_names_the_schema_and_ends_its_uri() -> None:
    from bridge import contract
    from bridge.pipeline import events

    assert contract.SCHEMA_URI.endswith(f"/v{contract.SCHEMA_VERSION}.json")
    assert f"maintenance-event.v{contract.SCHEMA_VERSION}.json" == events.SCHEMA_FILE
    assert events.schema()["$id"] == contract.SCHEMA_URI
