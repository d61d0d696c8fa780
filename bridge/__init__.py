"""maintenance-bridge: cloud VM maintenance notices as CloudEvents, delivered without loss."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("maintenance-bridge")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
