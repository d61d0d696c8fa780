"""Azure: its settings, watcher, provider (detection, doctor) and simulated
metadata service."""
