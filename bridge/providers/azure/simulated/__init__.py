"""The simulated Azure IMDS Scheduled Events (`part.py`: its part of `bridge.simulator`)."""
