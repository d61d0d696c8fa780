"""The simulated EC2 instance metadata service (`part.py`: its part of `bridge.simulator`)."""
