"""`[fleet.identity]` and a source's `identity` key: every mistake named by its key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.fleet.config import parse_fleet_config
from bridge.infra.validation import ConfigError


def config(tmp_path: Path, **identity: object) -> dict[str, object]:
    jwks = tmp_path / "jwks.json"
    jwks.write_text('{"keys": []}')
    table: dict[str, object] = {"audience": "https://fleet", "credential_key": "k" * 32}
    table["gce_jwks"] = str(jwks)
    return {
        "fleet": {
            "identity": table | identity,
            "sources": [{"type": "http", "identity": "required"}],
        }
    }


def test_a_complete_identity_table_is_taken(tmp_path: Path) -> None:
    parsed = parse_fleet_config(config(tmp_path))
    assert parsed.identity is not None
    assert parsed.sources[0].identity == "required"
    assert "k" * 32 not in repr(parsed)


BUS_SOURCES: dict[str, dict[str, object]] = {
    "http": {},
    "pubsub": {"subscription": "projects/p/subscriptions/s"},
    "eventhubs": {"connection_string": "Endpoint=sb://x/;EntityPath=h"},
    "kafka": {"bootstrap_servers": ["127.0.0.1:9092"], "topic": "t"},
}


@pytest.mark.parametrize("kind", list(BUS_SOURCES))
def test_identity_on_a_source_needs_the_identity_table(kind: str) -> None:
    source: dict[str, object] = {"type": kind, "identity": "optional", **BUS_SOURCES[kind]}
    with pytest.raises(ConfigError, match=r"sources\[0\].identity: needs a \[fleet.identity\]"):
        parse_fleet_config({"fleet": {"sources": [source]}})


@pytest.mark.parametrize("kind", list(BUS_SOURCES))
def test_every_source_takes_the_identity_key_off_by_default(tmp_path: Path, kind: str) -> None:
    raw = config(tmp_path)
    raw["fleet"]["sources"] = [{"type": kind, **BUS_SOURCES[kind]}]  # type: ignore[index]
    assert parse_fleet_config(raw).sources[0].identity == "off"
    raw["fleet"]["sources"][0]["identity"] = "required"  # type: ignore[index]
    assert parse_fleet_config(raw).sources[0].identity == "required"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"credential_key": "short"}, "credential_key: needs at least 32 bytes"),
        ({"gce_jwks": None}, "give the trust material of one cloud at least"),
        ({"audience": ""}, "audience: required"),
        ({"credential_ttl": 1}, "credential_ttl"),
        ({"azure_ca": "/nonexistent/ca.pem"}, "azure_ca: no file /nonexistent/ca.pem"),
    ],
)
def test_mistakes_are_named(tmp_path: Path, change: dict[str, object], message: str) -> None:
    raw = config(tmp_path)
    identity = raw["fleet"]["identity"]  # type: ignore[index]
    for key, value in change.items():
        if value is None:
            identity.pop(key)
        else:
            identity[key] = value
    with pytest.raises(ConfigError, match=message):
        parse_fleet_config(raw)


def test_a_mode_other_than_the_three_is_refused() -> None:
    with pytest.raises(ConfigError, match="identity"):
        parse_fleet_config({"fleet": {"sources": [{"type": "http", "identity": "yes"}]}})
