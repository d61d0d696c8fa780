"""The exit statuses every command shares (each command's `--help` says which it uses)."""

from typing import Final

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
#: A configuration error: a restart cannot fix it (the Windows service does not restart).
EXIT_CONFIG: Final = 2
