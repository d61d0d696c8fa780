"""The operator surface: the HTTP listener and its routes (health, metrics, the status API),
the Prometheus text format, `doctor`, and the Windows service's portable half.

Reads the pipeline and the actions; nothing below imports it (tests/test_layers.py).
"""
