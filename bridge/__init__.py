"""maintenance-bridge: cloud VM maintenance notices as CloudEvents, delivered without loss.

The version is written here, once, and pyproject.toml reads it from here (setuptools'
`dynamic` version): asking `importlib.metadata` at every start cost about 24 ms and 1 MiB,
which the sidecar's start-up and idle memory budgets do not have to spare.

This is the release (semantic versioning; CHANGELOG.md has a section per release): bumped
by hand when one is cut, a minor step for an additive change to the event contract. The
version naming a build adds the commit it was built from (`bridge.infra.buildinfo.version()`,
`0.2.0+g1a2b3c4`); that is what `--version`, heartbeats and the `User-Agent` carry.
"""

__version__ = "0.2.0"

__all__ = ["__version__"]
