<#
.SYNOPSIS
  maintenance-bridge hook: stop an IIS application pool (or a Windows service) before a
  maintenance, start it again when the maintenance is over.

.DESCRIPTION
  The bridge runs it with PowerShell (-NoProfile -NonInteractive -ExecutionPolicy Bypass -File)
  and passes the event's main fields as MB_* environment variables (MB_KIND, MB_STATUS,
  MB_NOT_BEFORE, MB_DEADLINE, ...) and the whole event as JSON on stdin. Exit status 0 means
  done; anything else is reported as a failed hook (and holds an approve-after-hooks
  approval back). Its output goes to the bridge's log.

.EXAMPLE
  command = ['C:\ProgramData\maintenance-bridge\hooks\Drain-IisAppPool.ps1', "DefaultAppPool"]
  command = ['C:\ProgramData\maintenance-bridge\hooks\Drain-IisAppPool.ps1', "DefaultAppPool", "-Start"]
  command = ['C:\ProgramData\maintenance-bridge\hooks\Drain-IisAppPool.ps1', "MSSQLSERVER", "-Service"]
#>
param(
    [Parameter(Mandatory = $true)][string]$Name,
    [switch]$Start,
    [switch]$Service,
    [int]$WaitSeconds = 90
)
$ErrorActionPreference = "Stop"
Write-Output "maintenance $env:MB_KIND $env:MB_STATUS ($env:MB_NOTICE_ID), not before $env:MB_NOT_BEFORE"

if ($Service) {
    if ($Start) { Start-Service -Name $Name } else { Stop-Service -Name $Name }
    (Get-Service -Name $Name).WaitForStatus($(if ($Start) { "Running" } else { "Stopped" }),
        [TimeSpan]::FromSeconds($WaitSeconds))
    Write-Output "service $Name is $((Get-Service -Name $Name).Status)"
    exit 0
}

Import-Module WebAdministration
$wanted = if ($Start) { "Started" } else { "Stopped" }
if ((Get-WebAppPoolState -Name $Name).Value -ne $wanted) {
    # Stop-WebAppPool lets requests in flight finish (the pool's shutdownTimeLimit).
    if ($Start) { Start-WebAppPool -Name $Name } else { Stop-WebAppPool -Name $Name }
}
$deadline = (Get-Date).AddSeconds($WaitSeconds)
while ((Get-WebAppPoolState -Name $Name).Value -ne $wanted) {
    if ((Get-Date) -gt $deadline) {
        Write-Error "app pool $Name did not reach $wanted within $WaitSeconds s"
        exit 1
    }
    Start-Sleep -Milliseconds 500
}
Write-Output "app pool $Name is $wanted"
