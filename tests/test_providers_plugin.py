"""A provider is one folder plus one registry line (docs/architecture.md, "Add a provider").

Pinned two ways: every registered provider supplies each part (settings, provider,
simulated metadata service) under the names the registry looks for, and the code that
iterates over the registry (`bridge/config.py` and `bridge/simulator/`) names no provider,
so a new one needs no line there.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bridge.config import parse_config
from bridge.contract import ProviderName
from bridge.providerapi import registry
from bridge.providerapi.settings import ProviderSettings
from bridge.providers import plugins
from bridge.simulator.part import BOTH, SimulatedProvider, part

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", registry.names())
def test_every_provider_supplies_each_part_from_its_own_folder(name: ProviderName) -> None:
    folder = registry.PROVIDERS[name]
    assert folder == f"bridge.providers.{name}"
    provider = plugins.get(name)
    assert provider.name == name
    assert type(provider).__module__ == f"{folder}.provider"
    settings = registry.settings_model(name)
    assert issubclass(settings, ProviderSettings)
    assert settings.__module__ == f"{folder}.settings"
    simulated = part(name)
    assert isinstance(simulated, SimulatedProvider)
    assert simulated.name == name
    assert type(simulated).__module__ == f"{folder}.simulated.part"
    # the configuration's [source.<name>] table is the provider's model, with its defaults
    assert getattr(parse_config({}).source, name) == settings()


def test_the_registry_refuses_a_part_of_the_wrong_type() -> None:
    """The registry cannot name the types of the floors above it; each reader checks its
    own, and a part that is not one is an error saying where it came from."""
    found = registry.load("gce", "provider")
    assert not isinstance(found, SimulatedProvider)
    error = registry.wrong_type("gce", "provider", found, "SimulatedProvider")
    assert str(error) == (
        "bridge.providers.gce.provider.PROVIDER is a Gce, not a SimulatedProvider"
    )


def test_a_name_no_provider_has_finds_no_plug_in() -> None:
    assert plugins.find("gce") is plugins.get("gce")
    assert plugins.find("nowhere") is None


def _named_providers(source: str, where: str) -> list[str]:
    """`where:line: 'name'` for each string constant that is a provider's name, outside the
    simulator's one alias (`BOTH`)."""
    tree = ast.parse(source)
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "BOTH" for t in targets):
                allowed.update(id(child) for child in ast.walk(node))
    names = set(registry.names())
    return [
        f"{where}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in allowed
    ]


def test_the_code_iterating_over_the_registry_names_no_provider() -> None:
    files = [ROOT / "bridge" / "config.py", *sorted((ROOT / "bridge" / "simulator").rglob("*.py"))]
    assert len(files) > 10
    found = [
        named
        for path in files
        for named in _named_providers(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert found == []


def test_the_check_sees_a_provider_named_in_code() -> None:
    sample = 'BOTH = ("gce", "azure")\n# "gce" in a comment\nif provider == "aws":\n    pass\n'
    assert _named_providers(sample, "sample.py") == ["sample.py:3: 'aws'"]


def test_both_is_the_two_clouds_simulated_before_aws() -> None:
    assert set(BOTH) <= set(registry.names())


def test_which_providers_approve_events_is_their_plugins_to_say() -> None:
    """The actions and the runner ask `approves_events`, never a provider's name: the clouds
    that approve are the ones with an approver (Azure today)."""
    approving = {name for name in registry.names() if plugins.get(name).approves_events}
    assert approving == {"azure"}
    for name in registry.names():
        plugin = plugins.get(name)
        assert (plugin.approver(lambda: None) is not None) == plugin.approves_events, name
    assert plugins.find("azure") is plugins.get("azure")
    assert plugins.find("a watcher of a test") is None


def test_whether_ids_ignore_case_is_their_plugins_to_say() -> None:
    """Azure's resource ids (ARM) compare without regard to case, the others' exactly; the
    fleet's identity checks ask the plug-in rather than test for a cloud's name."""
    arm = "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/vm"
    assert plugins.get("azure").same_id(arm, arm.lower())
    for name in registry.names():
        plugin = plugins.get(name)
        assert plugin.same_id("i-0ABC", "i-0ABC")
        assert plugin.same_id("i-0ABC", "i-0abc") == (name == "azure"), name
