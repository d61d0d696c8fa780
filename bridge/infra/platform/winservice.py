"""The Windows service (pywin32, the `[windows]` extra): hosted by pythonservice.exe.

`BridgeService` runs the bridge in the service's thread with `bridge.service.run_service`;
a stop request from the Service Control Manager (`service stop`, a shutdown) sets the
bridge's stop event, so the bridge ends as on SIGTERM: in-flight sends and running hooks
get `delivery.shutdown_timeout`, the rest waits in the spool. The service reports a stop
with a non-zero status as a failure, so the recovery actions that `service install` sets
restart it, except after a configuration error (exit status 2), which a restart cannot fix.

`PyWin32Services` is the real `bridge.service.ServiceManager`. Windows only: this module
imports pywin32 at the top, and nothing imports it but the service host and `service ...`.
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
from collections.abc import Iterable, Iterator
from pathlib import Path

import servicemanager
import win32service
import win32serviceutil

from bridge import service
from bridge.infra import platform
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


class BridgeService(win32serviceutil.ServiceFramework):
    _svc_name_ = service.NAME
    _svc_display_name_ = service.DISPLAY_NAME
    _svc_description_ = service.DESCRIPTION

    def __init__(self, args: Iterable[str]) -> None:
        super().__init__(args)
        self._stop = service.StopRequest()

    def SvcStop(self) -> None:
        self.ReportServiceStatus(win32service.SERVICE_STOP_PENDING, waitHint=STOP_WAIT_HINT_MS)
        self._stop.request()

    def SvcDoRun(self) -> None:
        system = platform.current()
        default = str(system.default_config_file())
        config = win32serviceutil.GetServiceCustomOption(
            self._svc_name_, service.OPTION_CONFIG, default
        )
        event_log = win32serviceutil.GetServiceCustomOption(
            self._svc_name_, service.OPTION_EVENT_LOG, "0"
        )
        extra: logging.Handler | None = None
        if event_log == "1":
            extra = logging.handlers.NTEventLogHandler(service.NAME)
            extra.setLevel(logging.WARNING)
        log_file = Windows().default_log_file()
        service.log_to_file(log_file, extra=extra)
        servicemanager.LogInfoMsg(f"{service.NAME}: starting with {config}; log in {log_file}")
        code = service.run_service(Path(str(config)), self._stop)
        if code != 0:
            servicemanager.LogErrorMsg(f"{service.NAME}: stopped with status {code}")
            if code != 2:
                # pywin32's host reports an exception from here as SERVICE_STOPPED with a
                # non-zero code: a failure, which the recovery actions answer with a restart.
                raise RuntimeError(f"{service.NAME} stopped with status {code}")


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """The manager's errors as `ServiceError`: one line for the user, no traceback."""
    try:
        yield
    except win32service.error as exc:
        raise service.ServiceError(f"{exc.funcname}: {exc.strerror}") from exc


class PyWin32Services:
    """`bridge.service.ServiceManager` through win32serviceutil and win32service."""

    def install(self, spec: service.ServiceSpec) -> None:
        with _refusals():
            self._install(spec)

    def _install(self, spec: service.ServiceSpec) -> None:
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
