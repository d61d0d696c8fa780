"""What a new user reads first says what the product does now: three clouds in the package
description, the usage docs not interrupted by benchmark results, the dashboard's example
zone named as the fleet names it. (The README's configuration example is checked by
tests/test_config_validation.py.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from bridge import contract

ROOT = Path(__file__).resolve().parent.parent


def _sections(markdown: str) -> list[str]:
    return re.findall(r"^## (.+)$", markdown, re.M)


def test_the_package_description_names_all_three_clouds() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for cloud in ("GCE", "Azure", "AWS"):
        assert cloud in project["description"]


def test_performance_is_summed_up_at_the_end_of_the_readme_and_detailed_in_its_own_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert _sections(readme)[-1] == "Performance"
    summary = readme.split("\n## Performance\n", 1)[1]
    assert "[docs/performance.md](docs/performance.md)" in summary
    assert "| measure |" not in readme  # the figures live in docs/performance.md
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert "| measure | bridge | vendor sample |" in page
    for target in re.findall(r"\]\((\.\./[^)#]+)\)", page):
        assert (ROOT / "docs" / target).resolve().exists(), target


def test_the_dashboard_example_zone_is_named_as_the_fleet_names_it() -> None:
    page = (ROOT / "docs" / "dashboard.md").read_text(encoding="utf-8")
    zones = re.findall(r"[?&]zone=([^&`\s]+)", page)
    assert zones
    for zone in zones:
        assert not zone.isdigit(), f"zone={zone}: an Azure zone number names no region"
    assert contract.zone_of("2", "eastus") in zones
