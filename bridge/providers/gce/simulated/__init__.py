"""The simulated GCE metadata server (`part.py`: its part of `bridge.simulator`)."""
