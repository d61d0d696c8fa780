"""Developer scripts run from the repository's root (not part of the package)."""
