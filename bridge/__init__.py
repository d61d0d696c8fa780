"""maintenance-bridge: cloud VM maintenance notices as CloudEvents, delivered without loss.

The version is written here, once, and pyproject.toml reads it from here (setuptools'
`dynamic` version): asking `importlib.metadata` at every start cost about 24 ms and 1 MiB,
which the sidecar's start-up and idle memory budgets do not have to spare.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
