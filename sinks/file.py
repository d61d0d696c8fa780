"""Appends each event as one JSON line to a file, flushed (and by default fsynced) per event.

Meant for audit logs picked up by a log shipper: one line per event, never a partial line
left behind by us, and the file is reopened on every batch so that logrotate's rename works
without a signal.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from cloudevents.core.v1.event import CloudEvent

from bridge.infra import platform
from bridge.sinkapi import Encoded, Ok, Result, Retry, Sink, SinkConfig, serialize


class Config(SinkConfig, frozen=True, kw_only=True):
    type: Literal["file"] = "file"
    path: Path
    fsync: bool = True


class FileSink(Sink):
    max_batch = 100

    def __init__(self, name: str, path: Path, fsync: bool = True) -> None:
        super().__init__(name)
        self.path = path
        self._fsync = fsync

    async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
        return self._append(b"".join(serialize(event) + b"\n" for event in batch))

    async def _publish_encoded(self, batch: Sequence[Encoded]) -> Result:
        """The spooled bytes are the line: no parsing them back to write them again."""
        return self._append(b"".join(item.body + b"\n" for item in batch))

    def _append(self, data: bytes) -> Result:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | platform.O_BINARY
            fd = os.open(self.path, flags, 0o640)
            try:
                size = os.fstat(fd).st_size
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    if self._fsync:
                        os.fsync(fd)
                except OSError:
                    # Never leave a torn line for the retry to append after.
                    os.ftruncate(fd, size)
                    raise
            finally:
                os.close(fd)
        except OSError as exc:
            # Disk full or permissions: the events stay spooled and are retried.
            return Retry(f"cannot append to {self.path}: {exc.strerror or exc}")
        return Ok()


def create(config: Config, name: str) -> FileSink:
    return FileSink(name, config.path, config.fsync)
