"""`bridge.infra.tls` on its own: the forms a certificate value takes, the private copy of PEM
text from the environment, and commands that need no connection needing no key."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.config import parse_config
from bridge.fleet.config import parse_fleet_config
from bridge.infra import tls
from bridge.infra.secrets import placeholders_for_missing
from tests.tls_certs import TestCa


def test_a_value_names_a_file_or_an_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_PEM", "-----BEGIN ...")
    assert tls.Pem.parse("/etc/x.pem") == tls.Pem(path=Path("/etc/x.pem"))
    assert tls.Pem.parse("file:/etc/x.pem") == tls.Pem(path=Path("/etc/x.pem"))
    assert tls.Pem.parse("env:SOME_PEM") == tls.Pem(env="SOME_PEM")
    assert str(tls.Pem.parse("env:SOME_PEM")) == "env:SOME_PEM"  # the name, never the value
    for bad, reason in [("env:NOT_SET_ANYWHERE", "is not set"), ("", "must name a file")]:
        with pytest.raises(ValueError, match=reason):
            tls.Pem.parse(bad)


def test_pem_text_from_the_environment_is_loaded_from_a_private_file_then_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = TestCa(tmp_path / "ca").issue("vm")
    monkeypatch.setenv("VM_KEY", key.read_text())
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen: list[int] = []
    original = tls.Pem.as_file

    def watching(self: tls.Pem) -> Iterator[str]:
        with original(self) as path:
            if self.env is not None:
                seen.append(Path(path).stat().st_mode & 0o777)
            yield path

    monkeypatch.setattr(tls.Pem, "as_file", contextlib.contextmanager(watching))
    context, info = tls.client_context(tls.TlsFiles(tls.Pem(cert), tls.Pem(env="VM_KEY")))
    assert info is not None
    assert info.subject == "CN=vm"
    assert context.minimum_version == tls.MINIMUM_VERSION
    assert seen == [0o600]
    assert list(scratch.iterdir()) == []


def test_commands_that_open_no_connection_need_no_readable_key(tmp_path: Path) -> None:
    """`spool list|replay|purge` load the configuration for the sinks' names only."""
    absent = str(tmp_path / "absent.pem")
    with placeholders_for_missing():
        parse_config(
            {
                "sinks": [
                    {
                        "type": "webhook",
                        "url": "https://x.example/",
                        "client_cert": absent,
                        "client_key": "env:NOT_SET_ANYWHERE",
                    }
                ]
            }
        )
        parse_fleet_config({"fleet": {"listener": {"tls_cert": absent, "tls_key": absent}}})
