"""The provider plug-in surface below every reader of it: the registry (which provider is in
which package, each part loaded by module name) and `ProviderSettings`, the base of every
`[source.<name>]` table.

One floor above the contract (docs/architecture.md): the configuration, the simulator and
the providers read it, so it imports only `bridge.contract` and `bridge.infra`. Deliberately
empty: importing the registry never imports a provider.
"""
