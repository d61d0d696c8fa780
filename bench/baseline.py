"""The baseline: the vendors' own sample loops, pointed at the simulator, printing what they see.

    python -m bench.baseline gce|azure BASE_URL

GCE: Google's `wait_for_maintenance` exactly as the simulator's fidelity tests run it
(tests/simulator/google_sample.py, a verbatim copy), with the sample's own
`maintenance_callback`. Azure: Microsoft's advanced sample (tests/simulator/azure_sample.py,
the same verbatim copy the approval tests run), driven as its `main` does when "1" is
pressed, forever. The only changes are the metadata URL
and this: every line they print is prefixed with `time.monotonic()` at the moment it is
printed, so the driver knows when the sample "held" the notice.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class StampedLines:
    """A stdout that prefixes each printed line with the monotonic time it was printed."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._partial = ""

    def write(self, text: str) -> int:
        self._partial += text
        while "\n" in self._partial:
            line, self._partial = self._partial.split("\n", 1)
            self._out.write(f"{time.monotonic():.6f} {line}\n")
            self._out.flush()
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._out, name)


def maintenance_callback(event: str | None) -> None:
    """The GCE sample's own example callback (same page, same text)."""
    if event:
        print(f"Undergoing host maintenance: {event}")
    else:
        print("Finished host maintenance")


def run_gce(base_url: str) -> None:
    from tests.simulator import google_sample

    google_sample.METADATA_URL = base_url
    google_sample.wait_for_maintenance(maintenance_callback)


def run_azure(base_url: str) -> None:
    from tests.simulator import azure_sample

    azure_sample.metadata_url = base_url + "scheduledevents"
    last_document_incarnation = "-1"
    while True:
        last_document_incarnation = azure_sample.advanced_sample(  # type: ignore[no-untyped-call]
            last_document_incarnation
        )


def main() -> None:
    provider, base_url = sys.argv[1], sys.argv[2]
    sys.stdout = StampedLines(sys.__stdout__ or sys.stdout)
    print("started")
    if provider == "gce":
        run_gce(base_url)
    else:
        run_azure(base_url)


if __name__ == "__main__":
    main()
