"""The clouds: one folder per provider (its watcher and metadata specifics), and detection.

Imports the pipeline and the infrastructure (tests/test_layers.py).
"""
