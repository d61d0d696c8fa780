"""Azure: its watcher (Scheduled Events) and metadata specifics."""
