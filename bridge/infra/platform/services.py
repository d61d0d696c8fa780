"""What the platform layer knows of a system service (the Windows service), without the product.

The Service Control Manager calls (`ServiceManager`) and the service host
(bridge/infra/platform/winservice.py) are pywin32 code and live in the platform layer; what
they register and what the service runs belong to the program above (bridge/app/service.py).
So the program hands them down: a `ServiceRegistration` to install, and a `ServiceProgram`
for the host to run. Nothing here imports the product, nor pywin32 (this module is portable:
the tests check on Linux which calls the program makes).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Final, Protocol

#: The service's own settings (stored with the service by `install`, read by the host).
OPTION_CONFIG: Final = "config"
OPTION_EVENT_LOG: Final = "event_log"


class ServiceError(Exception):
    """The Service Control Manager refused (not installed, access denied, ...)."""


class ServiceRegistration(Protocol):
    """How a service is registered."""

    @property
    def name(self) -> str: ...
    @property
    def display_name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def python_class(self) -> str:
        """What pythonservice.exe imports to host the service (`module.Class`)."""

    @property
    def restart_delays_ms(self) -> tuple[int, ...]:
        """Restart after a failure after each of these delays in turn."""

    @property
    def reset_period_s(self) -> int:
        """Seconds without a failure after which the failure count starts over."""

    @property
    def options(self) -> Mapping[str, str]:
        """The service's settings (`OPTION_CONFIG`, `OPTION_EVENT_LOG`)."""


class ServiceManager(Protocol):
    """The Service Control Manager calls (pywin32's win32serviceutil and win32service);
    each raises `ServiceError` when the manager refuses."""

    def install(self, spec: ServiceRegistration) -> None:
        """Register the service (automatic start), its options and its failure recovery."""

    def remove(self, name: str) -> None: ...

    def start(self, name: str) -> None: ...

    def stop(self, name: str) -> None: ...

    def status(self, name: str) -> str:
        """`running`, `stopped`, `start pending`, ... or `not installed`."""


class ServiceProgram(Protocol):
    """What the service host runs: `run` in the service's thread, `stop` from the control
    handler's thread (a `service stop`, a shutdown), before or while `run` runs."""

    def run(self, config: Path, log_file: Path, event_log: logging.Handler | None) -> int:
        """Run until stopped; the exit status (2: a configuration error, not restarted).
        `event_log`: a handler for the Windows Event Log when the service's option asks."""

    def stop(self) -> None: ...
