"""``python -m bridge.simulator``: the simulator without the main CLI."""

from bridge.app.simulate import main

raise SystemExit(main())
