"""Google Compute Engine: its watcher and metadata specifics."""
