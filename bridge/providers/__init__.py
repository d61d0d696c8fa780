"""The clouds: one folder per provider (its settings, watcher, provider and simulated
metadata service), the registry, and detection.

Imports the pipeline and the infrastructure (tests/test_layers.py); a provider's
`settings.py` belongs to the configuration's layer and its `simulated/` to the simulator's.
"""
