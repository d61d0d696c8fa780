"""Watchers: one per metadata service, each turning what it observes into `Notice` updates."""

from bridge.pipeline.watchers.base import Update, Watcher

__all__ = ["Update", "Watcher"]
