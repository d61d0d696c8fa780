"""What the bridge does about a notice besides delivering it: local hooks, approvals, the
audit events that record both, and fleet-wide coordination (the maintenance budget).

Imports the pipeline and the infrastructure, never the operator surface (tests/test_layers.py).
Deliberately empty: the coordination backends import their clients only when configured.
"""
