"""`python -m bridge` is the same command as `maintenance-bridge`."""

from bridge.cli import main

raise SystemExit(main())
