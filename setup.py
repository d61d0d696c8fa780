"""The build hook: a built package names the commit it was built from (bridge/infra/buildinfo.py).

Everything else about the package is in pyproject.toml. setuptools runs this file for every
build; its build step writes `bridge/_build.py` into the built package only (never into the
source tree), with the checkout's commit, or None where there is no git (the container
build copies neither this file nor `.git`: its package has no such module and is the plain
release). An sdist carries the module made from its checkout, and a wheel built from that
sdist keeps it.
"""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bridge.infra.buildinfo import build_module, git_commit  # noqa: E402 (the checkout's own)

GENERATED = Path("bridge", "_build.py")


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # runs from the checkout: bridge.infra.buildinfo reads its HEAD
            return
        target = Path(self.build_lib) / GENERATED
        found = git_commit(HERE)
        if found is None and target.exists():  # built from an sdist that names its commit
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(build_module(found), encoding="utf-8")


class Sdist(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        (Path(base_dir) / GENERATED).write_text(build_module(git_commit(HERE)), encoding="utf-8")


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
