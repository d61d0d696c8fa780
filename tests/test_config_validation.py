"""Validation of the configuration: every mistake named by its key path, in the file's terms;
secrets resolved at load time and never shown; URLs checked; environment overrides typed."""

from __future__ import annotations

import asyncio
import re
import sys
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest

from bridge import sink_registry as registry
from bridge.config import ConfigError, apply_env_overrides, parse_config
from bridge.infra.secrets import Secret
from bridge.infra.validation import validate
from bridge.providers.azure.settings import AzureSource
from bridge.sinkapi import Ok
from sinks import eventhubs, webhook
from tests.factories import sample_events


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    return caught.value.problems


def webhook_problems(**keys: Any) -> list[str]:
    return problems({"sinks": [{"type": "webhook", "url": "https://hooks.example.com/", **keys}]})


def test_independent_mistakes_are_all_listed_with_their_key_paths() -> None:
    raw = {
        "source": {"provider": "oci", "azure": {"pol_interval": 1, "poll_interval": 0.1}},
        "listener": {"port": "http"},
        "delivery": {"retry_initial": 0, "max_pending": 0},
        "state": {"dir": 7},
        "sources": {},
        "sinks": [{"type": "webhook"}, {"type": "stdout", "pretty": "yes"}],
    }
    assert problems(raw) == [
        "source.azure.pol_interval: unknown key; did you mean 'poll_interval'?",
        "source.azure.poll_interval: must be >= 0.2",
        "source.provider: must be one of 'auto', 'gce', 'azure', 'aws'",
        "state.dir: must be a string (a path)",
        "delivery.retry_initial: must be > 0",
        "delivery.max_pending: must be >= 1",
        "listener.port: must be an integer, not a string",
        "sources: unknown key; did you mean 'source'?",
        "sinks[0].url: required",
        "sinks[1].pretty: must be true or false, not a string",
    ]


def test_an_unknown_key_gets_the_closest_known_one_of_its_table() -> None:
    assert problems(
        {
            "sourse": {},
            "delivery": {"shutdown_timout": 3},
            "coordination": {"endpoints": ["http://etcd:2379"], "zone_name": "fleet"},
            "sinks": [{"type": "webhook", "url": "https://h.example/", "Headers": {}}],
            "listener": {"colour": "red"},
        }
    ) == [
        "delivery.shutdown_timout: unknown key; did you mean 'shutdown_timeout'?",
        "listener.colour: unknown key",  # nothing close: no guess
        "sourse: unknown key; did you mean 'source'?",
        "coordination.zone_name: unknown key; did you mean 'zone_naming'?",
        "sinks[0].Headers: unknown key; did you mean 'headers'?",
    ]


def test_sink_types_offered_are_the_ones_a_user_may_configure() -> None:
    assert "memory" not in registry.known_types()  # the tests' fake, not a product sink
    assert {"stdout", "file", "webhook", "pubsub", "eventhubs", "kafka"} <= set(
        registry.known_types()
    )
    assert problems({"sinks": [{"type": "webhok"}, {"name": "x"}]}) == [
        "sinks[0].type: unknown sink type 'webhok'; did you mean 'webhook'? "
        "(known: eventhubs, file, kafka, pubsub, stdout, webhook)",
        "sinks[1].type: required (one of: eventhubs, file, kafka, pubsub, stdout, webhook)",
    ]
    assert problems({"sinks": [{"type": "memroy"}]}) == [
        "sinks[0].type: unknown sink type 'memroy' "
        "(known: eventhubs, file, kafka, pubsub, stdout, webhook)"
    ]
    # Internal, not forbidden: embedding code and the tests still configure it.
    assert parse_config({"sinks": [{"type": "memory"}]}).sink_names() == ["memory"]


def test_tables_and_arrays_of_the_wrong_shape() -> None:
    assert problems({"source": 4, "hooks": {"command": ["x"]}}) == [
        "source: must be a table",
        "hooks: must be an array, not a table",
    ]
    assert problems({"sinks": {"type": "stdout"}}) == [
        "sinks: must be an array of tables ([[sinks]])"
    ]


def test_a_key_set_aside_does_not_cause_follow_up_errors() -> None:
    """A wrong required key is one mistake, not also a missing key; cross-key checks that
    would only see a default for it are not run."""
    assert problems({"approval": {"rules": [{"action": "sometimes", "min_duration": -1}]}}) == [
        "approval.rules[0].action: must be one of 'approve', 'approve-after-hooks', 'never'",
        "approval.rules[0].min_duration: must be >= 0",
    ]
    assert webhook_problems(signing="standard", secrets="not-a-list") == [
        "sinks[0].secrets: must be an array, not a string"
    ]


def test_numbers_and_strings_are_read_as_the_key_needs() -> None:
    config = parse_config({"source": {"azure": {"poll_interval": 1}}, "listener": {"port": "8080"}})
    assert config.source.azure.poll_interval == 1.0
    assert isinstance(config.source.azure.poll_interval, float)
    assert config.listener.port == 8080
    assert problems({"listener": {"port": 80.5}}) == [
        "listener.port: must be an integer, not a number"
    ]


def test_environment_overrides_are_toml_values_checked_like_the_file() -> None:
    environ = {
        "MAINTENANCE_BRIDGE__SOURCE__AZURE__POLL_INTERVAL": "2",
        "MAINTENANCE_BRIDGE__LISTENER__ENABLED": "false",
        "MAINTENANCE_BRIDGE__STATE__DIR": "/srv/bridge",
        "MAINTENANCE_BRIDGE__SINKS__0__TYPE": "webhook",
        "MAINTENANCE_BRIDGE__SINKS__0__URL": "https://hooks.example.com/m",
    }
    config = parse_config(apply_env_overrides({}, environ))
    assert config.source.azure.poll_interval == 2.0
    assert config.listener.enabled is False
    assert config.state.dir == Path("/srv/bridge")
    (sink,) = config.sinks
    assert isinstance(sink, webhook.Config)
    assert sink.url == "https://hooks.example.com/m"
    bad = apply_env_overrides({}, {"MAINTENANCE_BRIDGE__LISTENER__PORT": "http"})
    assert problems(bad) == ["listener.port: must be an integer, not a string"]


def test_urls_must_be_http_with_a_host() -> None:
    assert webhook_problems(url="ftp://hooks.example.com/") == [
        "sinks[0].url: must be an http:// or https:// URL"
    ]
    assert webhook_problems(url="https:///path") == ["sinks[0].url: must name a host"]
    assert webhook_problems(url=42) == [
        "sinks[0].url: must be a string: an http:// or https:// URL"
    ]
    assert webhook_problems(proxy="http://proxy:port") == [
        "sinks[0].proxy: not a valid URL: Port could not be cast to integer value as 'port'"
    ]
    config = validate(webhook.Config, {"type": "webhook", "url": "https://h.example.com?a=1"})
    assert config.url == "https://h.example.com/?a=1"  # the path HTTP sends for an empty one
    azure = validate(AzureSource, {"imds_url": "http://127.0.0.1:8000/metadata"})
    assert azure.imds_url == "http://127.0.0.1:8000/metadata/"


def test_secret_resolution_errors_name_the_key(tmp_path: Path) -> None:
    assert webhook_problems(headers={"X-Api-Key": "env:SURELY_NOT_SET_ANYWHERE_42"}) == [
        "sinks[0].headers.X-Api-Key: environment variable SURELY_NOT_SET_ANYWHERE_42 is not set"
    ]
    missing = tmp_path / "token"
    assert webhook_problems(bearer_token=f"file:{missing}") == [
        f"sinks[0].bearer_token: cannot read secret file {missing}: No such file or directory"
    ]
    assert webhook_problems(bearer_token=7) == [
        "sinks[0].bearer_token: must be a string: a literal, env:VAR or file:PATH"
    ]


def test_secrets_are_resolved_at_load_and_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOK_TOKEN", "token-from-env")
    (tmp_path / "key").write_text("key-from-file\n")
    conn = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=sas"
    config = parse_config(
        {
            "sinks": [
                {
                    "type": "webhook",
                    "url": "https://hooks.example.com/",
                    "bearer_token": "env:HOOK_TOKEN",
                    "headers": {"X-Api-Key": f"file:{tmp_path / 'key'}", "X-Team": "literal-sre"},
                },
                {"type": "eventhubs", "connection_string": conn},
            ]
        }
    )
    hook, hub = config.sinks
    assert isinstance(hook, webhook.Config)
    assert isinstance(hub, eventhubs.Config)
    assert hook.bearer_token is not None
    assert hook.bearer_token.get_secret_value() == "token-from-env"
    assert hook.headers["X-Api-Key"].get_secret_value() == "key-from-file"
    assert hub.connection_string is not None
    assert hub.connection_string.get_secret_value() == conn
    for text in (repr(config), str(config), repr(hook), repr(hub)):
        for value in ("token-from-env", "key-from-file", "literal-sre", "sas", "HOOK_TOKEN"):
            assert value not in text
    assert repr(hook.bearer_token) == "Secret('**********')"
    assert str(hook.bearer_token) == "**********"


def test_secret_equality_and_hash_follow_the_value() -> None:
    assert Secret("a") == Secret("a")
    assert Secret("a") != Secret("b")
    assert Secret("a") != "a"  # never equal to the plain text it hides
    assert len({Secret("a"), Secret("a"), Secret("b")}) == 2


def test_validate_is_the_one_way_to_build_a_model_from_data() -> None:
    with pytest.raises(ConfigError) as caught:
        validate(eventhubs.Config, {"type": "eventhubs", "mode": "json", "retries": 1})
    assert caught.value.problems == [
        "mode: must be one of 'binary', 'structured'",
        "retries: unknown key",
    ]
    with pytest.raises(ConfigError, match=r"\(top level\): set connection_string"):
        validate(eventhubs.Config, {"type": "eventhubs"})


def test_the_documented_sink_plugin_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """README's "Your own sink" example, loaded as the registry would load a plugin (by its
    module name: installing a package with an entry point is the one step not taken here)."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Your own sink", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    module = types.ModuleType("readme_audit_sink")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(code, "README.md", "exec"), module.__dict__)  # noqa: S102 - our own README
    monkeypatch.setitem(registry.BUILTIN, "audit", module.__name__)

    entry = {"type": "audit", "url": "https://audit.example.com/", "token": "t0ken"}
    (config,) = parse_config({"sinks": [entry]}).sinks
    assert isinstance(config, module.Config)
    assert "t0ken" not in repr(config)
    assert problems({"sinks": [{**entry, "labels": ["a", ""]}]}) == [
        "sinks[0].labels: must not contain an empty label"
    ]
    assert problems({"sinks": [{**entry, "url": "ftp://x", "timeout": 0, "tls": True}]}) == [
        "sinks[0].url: must be an http:// or https:// URL",
        "sinks[0].timeout: must be > 0",
        "sinks[0].tls: unknown key",
    ]
    sink = registry.create(config, "audit")
    assert asyncio.run(sink.publish(sample_events(2))) == Ok()
    assert len(sink.sent) == 2  # type: ignore[attr-defined]


def test_the_readme_configuration_example_is_valid_and_names_every_cloud_and_sink(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    example = re.findall(r"```toml\n(.*?)```", section, re.S)[0]
    monkeypatch.setenv("KAFKA_PASSWORD", "example")
    config = parse_config(tomllib.loads(example))
    for provider in ("gce", "azure", "aws"):
        assert f"[source.{provider}]" in example
    assert "gce | azure | aws | auto" in example
    offered = re.search(r'type = "webhook" +# (.*)\n', example)
    assert offered is not None
    assert set(offered[1].split(" | ")) == set(registry.known_types())
    assert {sink.type for sink in config.sinks} == {"webhook", "kafka"}
