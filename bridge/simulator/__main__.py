"""``python -m bridge.simulator``: the simulator without the main CLI."""

from .cli import main

raise SystemExit(main())
