"""Ingest sources of the fleet service (see `base` for the interface every source implements)."""
