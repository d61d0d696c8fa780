"""Amazon EC2: its watcher and the IMDS client specifics."""
