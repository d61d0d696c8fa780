"""The fleet side: one fleet state built from the events of every sidecar, and an API on it.

`maintenance-bridge fleet` runs the fleet service. Its parts, each behind a small interface
so other transports and databases plug in without touching the rest:

- `sources` (`bridge.fleet.sources.base.Source`): where events come from. `http` (the
  sidecars' webhook sink posts to `POST /v1/events`) is built in; Pub/Sub, Event Hubs and
  Kafka sources implement the same interface.
- `store` (`bridge.fleet.store.Store`): where the fleet state lives. SQLite
  (`bridge.fleet.sqlite_store`) is the default; a PostgreSQL store implements the same
  interface with the same SQL (`bridge.fleet.sql`; the shared write side in
  `bridge.fleet.writes`, the queries in `bridge.fleet.reads`, the schema's versions in
  `bridge.fleet.migrations`).
- `state`: the rules both stores apply (which transition wins, who is silent, who is
  eligible), pure functions.
- `api`: `/v1/fleet/...`, `/metrics`, `/healthz`, `/readyz` on one aiohttp listener.
- `service`: puts them together for the `fleet` command.

The sidecar's `run` path never imports this package (tests/fleet/test_isolation.py).
"""
