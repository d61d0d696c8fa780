"""Shared infrastructure: the HTTP/1.1 client, configuration validation and secrets, the retry
policy, time parsing, logging, the state-directory lock and the platform layer.

Imports nothing else of `bridge` (tests/test_layers.py): every other package may use it, and
the sink plug-ins reach it through `bridge.sinkapi`. Deliberately empty, so that importing one
module here never imports the others.
"""
