"""Hook, approval and status settings: every mistake is reported with its key's path."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from bridge.config import ConfigError, apply_env_overrides, parse_config


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    return caught.value.problems


def test_hook_mistakes_name_their_keys() -> None:
    assert problems({"hooks": [{"command": []}]}) == ["hooks[0].command: must have at least 1 item"]
    assert problems({"hooks": [{"command": ["x"], "statuses": ["done"], "shell": True}]}) == [
        "hooks[0].statuses[0]: must be one of 'scheduled', 'started', 'completed', 'cancelled'",
        "hooks[0].shell: unknown key",
    ]
    assert problems({"hooks": [{"command": ["/a/drain"]}, {"command": ["/b/drain"]}]}) == [
        "hooks: the name 'drain' is used twice; give each hook a `name`"
    ]


def test_approval_mistakes_name_their_keys() -> None:
    assert problems({"approval": {"leader": "first", "preset": "azure"}}) == [
        "approval.leader: must be one of 'sorted-first', 'self', 'none'",
        "approval.preset: must be 'vendor-sample'",
    ]
    rule = {"action": "approve", "min_duration": 9, "max_duration": 8}
    assert problems({"approval": {"rules": [rule]}}) == [
        "approval.rules[0]: min_duration is greater than max_duration"
    ]
    assert problems({"approval": {"rules": [{"action": "approve-after-hooks"}]}}) == [
        "approval.rules[0].action: approve-after-hooks needs [[hooks]]"
    ]


def test_defaults_never_approve_and_run_no_hook() -> None:
    config = parse_config({})
    assert config.hooks == ()
    assert (config.approval.leader, config.approval.preset, config.approval.rules) == (
        "sorted-first",
        None,
        (),
    )
    assert config.status.eligible_horizon == 3600


def test_hooks_and_rules_can_be_set_from_the_environment() -> None:
    raw = apply_env_overrides(
        {"hooks": [{"command": ["drain"]}]},
        {
            "MAINTENANCE_BRIDGE__HOOKS__0__TIMEOUT": "5",
            "MAINTENANCE_BRIDGE__APPROVAL__RULES__0__ACTION": "approve",
        },
    )
    config = parse_config(raw)
    assert config.hooks[0].timeout == 5
    assert config.approval.rules[0].action == "approve"


def test_every_readme_recipe_is_a_valid_configuration() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Acting on notices", 1)[1].split("\n## ", 1)[0]
    recipes = re.findall(r"```toml\n(.*?)```", section, re.S)
    assert len(recipes) == 6
    for recipe in recipes:
        parse_config(tomllib.loads(recipe))
