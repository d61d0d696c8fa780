"""The programs: what each command does from start to exit.

`bridge/cli.py` parses the command line and calls one function here; everything below
(`fleet`, the sidecar's packages, `infra`) is logic that knows nothing of a process, its
signals or its exit status. Only the entry points (`bridge/cli.py`, `bridge/__main__.py`,
`bridge/simulator/__main__.py`) import this package, and this file imports nothing, so a
command loads only its own program.
"""
