"""The delivery pipeline: the notice model and its CloudEvent encoding, the watchers' common
base and metadata client, the spool (the outbox) and the dispatcher that drains it to the
sinks, and the heartbeats that take the same road.

Imports `bridge.infra`, `bridge.contract`, `bridge.config` and the sink plug-in surface; never
the actions or the operator surface (tests/test_layers.py). Deliberately empty: `run` imports
only the modules it uses.
"""
