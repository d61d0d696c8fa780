"""The clouds: one folder per provider (its settings, watcher, provider and simulated
metadata service), `plugins` (the registered providers, typed) and detection.

The registry itself and the settings base are one floor below, in `bridge.providerapi`
(docs/architecture.md): the configuration and the simulator read them. A provider's
`settings.py` imports only that floor and `bridge.infra` (the configuration loads it by
name); its `simulated/` imports the simulator, which sits below the providers.
"""
