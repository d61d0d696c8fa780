"""The Windows service, its portable half: what `maintenance-bridge service ...` asks of the
service manager, and the bridge run that a service stop request ends.

The pywin32 half is the platform layer's (bridge/infra/platform/winservice.py): a service host
that runs the `ServiceProgram` this module hands it (`BridgeProgram`, through
bridge/app/winservice.py, the class pythonservice.exe hosts), and the Service Control Manager
behind `ServiceManager`. So the tests check on Linux which calls `install`, `uninstall`,
`start`, `stop` and `status` make, and run the real bridge under `run_service` with a stop
requested from another thread, as the service control handler does.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import logging.handlers
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bridge.app.exits import EXIT_FAILURE
from bridge.infra import platform
from bridge.infra.logs import JsonFormatter
from bridge.infra.platform.services import (
    OPTION_CONFIG,
    OPTION_EVENT_LOG,
    ServiceError,
    ServiceManager,
)

NAME: Final = "maintenance-bridge"
DISPLAY_NAME: Final = "maintenance-bridge"
DESCRIPTION: Final = (
    "Watches the cloud's VM maintenance notices (GCE, Azure Scheduled Events) and delivers "
    "them as CloudEvents."
)
#: What pythonservice.exe imports to host the service.
CLASS: Final = "bridge.app.winservice.BridgeService"
#: Restart after a failure: after 5 s, 5 s, then 30 s; the failure count resets after a day.
RESTART_DELAYS_MS: Final = (5_000, 5_000, 30_000)
RESET_PERIOD_S: Final = 86_400
#: The service's log: JSON lines, rotated at this size, this many old files kept.
LOG_MAX_BYTES: Final = 10 * 1024 * 1024
LOG_BACKUPS: Final = 5


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """How the service is registered (a `ServiceRegistration` of the platform layer)."""

    config: Path
    event_log: bool = False
    name: str = NAME
    display_name: str = DISPLAY_NAME
    description: str = DESCRIPTION
    python_class: str = CLASS
    restart_delays_ms: tuple[int, ...] = RESTART_DELAYS_MS
    reset_period_s: int = RESET_PERIOD_S
    options: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "options",
            {OPTION_CONFIG: str(self.config), OPTION_EVENT_LOG: "1" if self.event_log else "0"},
        )


def control(action: str, manager: ServiceManager, spec: ServiceSpec) -> tuple[int, str]:
    """Carry out `maintenance-bridge service ACTION`; the exit status and what to print."""
    if action == "install":
        if not spec.config.is_file():
            return 2, f"no configuration at {spec.config}: write it first (or pass --config)"
        manager.install(spec)
        return 0, (
            f"installed service {spec.name} (automatic start, restarted after a failure), "
            f"configuration {spec.config}; start it with: maintenance-bridge service start"
        )
    if action == "uninstall":
        state = manager.status(spec.name)
        if state == "not installed":
            return 0, f"service {spec.name} is not installed"
        if state != "stopped":
            manager.stop(spec.name)
        manager.remove(spec.name)
        return 0, f"removed service {spec.name}"
    if action == "start":
        manager.start(spec.name)
        return 0, f"started service {spec.name}"
    if action == "stop":
        manager.stop(spec.name)
        return 0, f"stopped service {spec.name}"
    state = manager.status(spec.name)
    return (0 if state == "running" else 3), f"{spec.name}: {state}"


def log_to_file(path: Path, verbose: int = 0, extra: logging.Handler | None = None) -> None:
    """The service's logging: JSON lines to `path`, rotated (a service has no stderr)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8"
    )
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler] if extra is None else [handler, extra]
    root.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)


class StopRequest:
    """A stop asked from another thread (the service control handler), before or while the
    bridge's event loop runs: it is never lost between the two."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked = False
        self._target: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def bind(self, event: asyncio.Event) -> None:
        """Called on the loop: `event` is set when a stop is (or was) requested."""
        with self._lock:
            self._target = (asyncio.get_running_loop(), event)
            asked = self._asked
        if asked:
            event.set()

    def request(self) -> None:
        """From any thread."""
        with self._lock:
            self._asked = True
            target = self._target
        if target is not None:
            loop, event = target
            loop.call_soon_threadsafe(event.set)


def run_service(config: Path, stop: StopRequest) -> int:
    """Run the bridge until `stop` is requested; its exit status (2: configuration error)."""
    from bridge.app.sidecar import serve

    async def main() -> int:
        event = asyncio.Event()
        stop.bind(event)
        return await serve(config, event)

    return asyncio.run(main())


class BridgeProgram:
    """The bridge as the service host runs it (a `ServiceProgram` of the platform layer)."""

    def __init__(self) -> None:
        self._stop = StopRequest()

    def run(self, config: Path, log_file: Path, event_log: logging.Handler | None) -> int:
        log_to_file(log_file, extra=event_log)
        return run_service(config, self._stop)

    def stop(self) -> None:
        self._stop.request()


def main(args: argparse.Namespace) -> int:
    """`maintenance-bridge service install|uninstall|start|stop|status`."""
    try:
        manager = platform.service_manager()
    except RuntimeError as exc:
        print(f"maintenance-bridge service: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    config = getattr(args, "config", None) or platform.current().default_config_file()
    spec = ServiceSpec(config.resolve(), getattr(args, "event_log", False))
    try:
        code, message = control(args.service_command, manager, spec)
    except ServiceError as exc:
        print(f"maintenance-bridge service {args.service_command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(message, file=sys.stdout if code in (0, 3) else sys.stderr)
    return code
