#Requires -RunAsAdministrator
<#
.SYNOPSIS
  Installs maintenance-bridge as a Windows service (Windows Server 2019/2022, CPython >= 3.11).

.DESCRIPTION
  1. pip-installs maintenance-bridge with the [windows] extra (pywin32) into the given Python
     (a system-wide installation: pywin32's service host, pythonservice.exe, does not run
     from a virtual environment), plus any further extras (pubsub, eventhubs);
  2. registers pywin32's DLLs and service host (pywin32_postinstall);
  3. creates %ProgramData%\maintenance-bridge\ (state, logs, hooks), readable and writable
     by SYSTEM and Administrators only, and puts the configuration there;
  4. validates the configuration, registers the service (automatic start, restarted after a
     failure) and starts it.

.EXAMPLE
  .\install.ps1 -Config .\config.toml -Extras pubsub
  .\install.ps1 -Python 'C:\Program Files\Python311\python.exe' -EventLog
#>
param(
    [string]$Python = (Get-Command python.exe -ErrorAction Stop).Source,
    [string]$Config = "",
    [string]$Extras = "",
    [string]$Package = "maintenance-bridge",
    [switch]$EventLog
)
$ErrorActionPreference = "Stop"

function Invoke-Checked([string]$File, [string[]]$Arguments) {
    & $File @Arguments
    if ($LASTEXITCODE -ne 0) { throw "$File $($Arguments -join ' ') failed with exit status $LASTEXITCODE" }
}

$extrasList = @("windows") + ($Extras -split "," | Where-Object { $_ })
Invoke-Checked $Python @("-m", "pip", "install", "--upgrade", "$Package[$($extrasList -join ',')]")
Invoke-Checked $Python @("-m", "pywin32_postinstall", "-install")

$base = Join-Path $env:ProgramData "maintenance-bridge"
foreach ($dir in @($base, "$base\state", "$base\logs", "$base\hooks")) {
    New-Item -ItemType Directory -Force -Path $dir | Out-Null
}
# Only SYSTEM (the service's account) and Administrators: the spool, the logs and secrets.
Invoke-Checked icacls.exe @($base, "/inheritance:r", "/grant:r", "SYSTEM:(OI)(CI)F", "Administrators:(OI)(CI)F")

$target = Join-Path $base "config.toml"
if ($Config) {
    Copy-Item -Force $Config $target
} elseif (-not (Test-Path $target)) {
    Copy-Item (Join-Path $PSScriptRoot "config.toml") $target
}
Copy-Item -Force (Join-Path $PSScriptRoot "hooks\*.ps1") "$base\hooks"

$bridge = @("-m", "bridge")
Invoke-Checked $Python ($bridge + @("validate-config", $target))
$install = $bridge + @("service", "install", "--config", $target)
if ($EventLog) { $install += "--event-log" }
Invoke-Checked $Python $install
Invoke-Checked $Python ($bridge + @("service", "start"))
Invoke-Checked $Python ($bridge + @("service", "status"))
Write-Host "logs: $base\logs\bridge.jsonl    status: maintenance-bridge service status"
