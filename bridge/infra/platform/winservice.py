"""The Windows service host and manager (pywin32, the `[windows]` extra).

`host` makes the class pythonservice.exe hosts: it runs the `ServiceProgram` it is handed
(the product's, from bridge/app/) in the service's thread; a stop request from the Service
Control Manager (`service stop`, a shutdown) is passed to the program, which ends as on
SIGTERM. The host reports a stop with a non-zero status as a failure, so the recovery actions
that `service install` sets restart it, except after a configuration error (exit status 2),
which a restart cannot fix.

`PyWin32Services` is the real `ServiceManager` (bridge/infra/platform/services.py). Windows
only: this module imports pywin32 at the top, and nothing imports it but
`platform.service_host` and `platform.service_manager`.
"""

# The platform assertion must precede the Windows-only imports for mypy --platform linux to
# skip this module, hence imports below a statement:
# ruff: noqa: E402
from __future__ import annotations

import sys

assert sys.platform == "win32"  # mypy: the rest of this module is Windows-only

import contextlib
import logging
import logging.handlers
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import servicemanager
import win32service
import win32serviceutil

from bridge.infra.platform.services import (
    OPTION_CONFIG,
    OPTION_EVENT_LOG,
    ServiceError,
    ServiceProgram,
    ServiceRegistration,
)
from bridge.infra.platform.windows import Windows

_STATES = {
    win32service.SERVICE_STOPPED: "stopped",
    win32service.SERVICE_START_PENDING: "start pending",
    win32service.SERVICE_STOP_PENDING: "stop pending",
    win32service.SERVICE_RUNNING: "running",
    win32service.SERVICE_CONTINUE_PENDING: "continue pending",
    win32service.SERVICE_PAUSE_PENDING: "pause pending",
    win32service.SERVICE_PAUSED: "paused",
}
#: The service's stop wait hint: the bridge's default shutdown, twice, plus a margin.
STOP_WAIT_HINT_MS = 30_000


def host(
    name: str, display_name: str, description: str, program: Callable[[], ServiceProgram]
) -> type[win32serviceutil.ServiceFramework]:
    """The service class for pythonservice.exe: one `program()` per service start."""

    class ServiceHost(win32serviceutil.ServiceFramework):
        _svc_name_ = name
        _svc_display_name_ = display_name
        _svc_description_ = description

        def __init__(self, args: Iterable[str]) -> None:
            super().__init__(args)
            self._program = program()

        def SvcStop(self) -> None:
            self.ReportServiceStatus(win32service.SERVICE_STOP_PENDING, waitHint=STOP_WAIT_HINT_MS)
            self._program.stop()

        def SvcDoRun(self) -> None:
            default = str(Windows().default_config_file())
            config = win32serviceutil.GetServiceCustomOption(name, OPTION_CONFIG, default)
            event_log = win32serviceutil.GetServiceCustomOption(name, OPTION_EVENT_LOG, "0")
            extra: logging.Handler | None = None
            if event_log == "1":
                extra = logging.handlers.NTEventLogHandler(name)
                extra.setLevel(logging.WARNING)
            log_file = Windows().default_log_file()
            servicemanager.LogInfoMsg(f"{name}: starting with {config}; log in {log_file}")
            code = self._program.run(Path(str(config)), log_file, extra)
            if code != 0:
                servicemanager.LogErrorMsg(f"{name}: stopped with status {code}")
                if code != 2:
                    # pywin32's host reports an exception from here as SERVICE_STOPPED with a
                    # non-zero code: a failure, which the recovery actions answer with a restart.
                    raise RuntimeError(f"{name} stopped with status {code}")

    return ServiceHost


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """The manager's errors as `ServiceError`: one line for the user, no traceback."""
    try:
        yield
    except win32service.error as exc:
        raise ServiceError(f"{exc.funcname}: {exc.strerror}") from exc


class PyWin32Services:
    """The `ServiceManager` through win32serviceutil and win32service."""

    def install(self, spec: ServiceRegistration) -> None:
        with _refusals():
            self._install(spec)

    def _install(self, spec: ServiceRegistration) -> None:
        win32serviceutil.InstallService(
            spec.python_class,
            spec.name,
            spec.display_name,
            startType=win32service.SERVICE_AUTO_START,
            description=spec.description,
        )
        for key, value in spec.options.items():
            win32serviceutil.SetServiceCustomOption(spec.name, key, value)
        manager = win32service.OpenSCManager(None, None, win32service.SC_MANAGER_ALL_ACCESS)
        try:
            handle = win32service.OpenService(manager, spec.name, win32service.SERVICE_ALL_ACCESS)
            try:
                actions = [(win32service.SC_ACTION_RESTART, ms) for ms in spec.restart_delays_ms]
                win32service.ChangeServiceConfig2(
                    handle,
                    win32service.SERVICE_CONFIG_FAILURE_ACTIONS,
                    {
                        "ResetPeriod": spec.reset_period_s,
                        "RebootMsg": "",
                        "Command": "",
                        "Actions": actions,
                    },
                )
                # Also when the service stops itself with an error, not only on a crash.
                win32service.ChangeServiceConfig2(
                    handle, win32service.SERVICE_CONFIG_FAILURE_ACTIONS_FLAG, True
                )
            finally:
                win32service.CloseServiceHandle(handle)
        finally:
            win32service.CloseServiceHandle(manager)

    def remove(self, name: str) -> None:
        with _refusals():
            win32serviceutil.RemoveService(name)

    def start(self, name: str) -> None:
        with _refusals():
            win32serviceutil.StartService(name)
            win32serviceutil.WaitForServiceStatus(name, win32service.SERVICE_RUNNING, 60)

    def stop(self, name: str) -> None:
        with _refusals():
            win32serviceutil.StopService(name)
            win32serviceutil.WaitForServiceStatus(name, win32service.SERVICE_STOPPED, 60)

    def status(self, name: str) -> str:
        try:
            state = win32serviceutil.QueryServiceStatus(name)[1]
        except win32service.error:
            return "not installed"
        return _STATES.get(state, f"state {state}")
