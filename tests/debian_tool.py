"""A command-line tool from a Debian package, for the tests that check deploy/ with it.

`systemd-analyze`, `docker-compose` and `promtool` are what operators check these files
with. When one is missing the set-up installs its package with apt-get if it runs as root;
otherwise the test skips on a laptop, and fails under `CI=true` (as for the other real parts:
tests/etcd_server.py, tests/fleet/postgres_server.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.support import running_as_root

_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def debian_tool(command: str, package: str) -> str:
    """The path of `command`, installing Debian's `package` when missing and possible."""
    found = shutil.which(command)
    if found is None and running_as_root() and shutil.which("apt-get") is not None:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", package]
        for argv in (["apt-get", "update"], install):
            if subprocess.run(argv, env=env, capture_output=True, timeout=900).returncode:
                break
        found = shutil.which(command)
    if found is None:
        message = f"{command} is needed: install Debian's {package} package"
        if _CI:
            pytest.fail(message)
        pytest.skip(message)
    return found
