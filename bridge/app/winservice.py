"""What pythonservice.exe hosts as the Windows service (`service.CLASS` names it): the
platform layer's service host, handed the bridge to run. Windows with pywin32 only: elsewhere
importing this module raises `RuntimeError`, and nothing but pythonservice.exe imports it."""

from bridge.app import service
from bridge.infra import platform

BridgeService = platform.service_host(
    service.NAME, service.DISPLAY_NAME, service.DESCRIPTION, service.BridgeProgram
)
