"""The official Google Pub/Sub emulator as a test server, and helpers to read it back.

The emulator is the Java server shipped with the Google Cloud CLI. We run its launcher
script directly (not through ``gcloud``, whose wrapper would outlive a kill and leave the
Java server running) in its own process group, wait for its "Server started" line and
stop the whole group. Its state lives in memory, so a restart (same port) loses topics and
subscriptions: callers recreate them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bridge.infra import platform
from tests.support import free_port

SDK_ROOTS = (
    os.environ.get("CLOUDSDK_ROOT_DIR", ""),
    "/usr/lib/google-cloud-sdk",
    "/usr/share/google-cloud-sdk",
    "/opt/google-cloud-sdk",
)
SCRIPT = Path("platform/pubsub-emulator/bin/cloud-pubsub-emulator")
PROJECT = "test-project"
START_TIMEOUT = 60.0
INSTALL_HELP = (
    "The Pub/Sub emulator is needed for the Pub/Sub sink tests. Install the Google Cloud CLI "
    "(https://cloud.google.com/sdk/docs/install) with its emulator component, e.g. "
    "`apt-get install google-cloud-cli-pubsub-emulator openjdk-17-jre-headless` or "
    "`gcloud components install pubsub-emulator beta`, and a Java 11+ runtime on PATH. "
    "Set CLOUDSDK_ROOT_DIR if the SDK lives elsewhere than /usr/lib/google-cloud-sdk."
)


def find_script() -> Path | None:
    """The emulator's launcher script, if the SDK component and Java are installed."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return None
    gcloud = shutil.which("gcloud")
    roots = [*SDK_ROOTS]
    if gcloud:
        roots.append(str(Path(os.path.realpath(gcloud)).parent.parent))
    for root in roots:
        if root and (Path(root) / SCRIPT).is_file():
            return Path(root) / SCRIPT
    return None


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass
class Emulator:
    """One emulator server process (group) on a fixed port; restartable on the same port."""

    script: Path
    port: int = field(default_factory=free_port)
    startup_seconds: float = 0.0
    _proc: subprocess.Popen[bytes] | None = None
    _log: Path | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the server and block until it logs "Server started" (or fail loudly)."""
        assert not self.running
        directory = Path(tempfile.mkdtemp(prefix="pubsub-emulator-"))
        self._log = directory / "emulator.log"
        began = time.monotonic()
        with self._log.open("wb") as log:
            self._proc = subprocess.Popen(
                [str(self.script), "--host=127.0.0.1", f"--port={self.port}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=directory,
                **platform.current().spawn_options(),
            )
        while time.monotonic() - began < timeout:
            text = self.log_text()
            if "Server started" in text:
                self.startup_seconds = time.monotonic() - began
                return
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        output = self.log_text()[-3000:]
        self.stop()
        raise RuntimeError(
            f"Pub/Sub emulator did not start within {timeout}s on port {self.port}:\n{output}"
        )

    def log_text(self) -> str:
        return self._log.read_text(errors="replace") if self._log and self._log.exists() else ""

    def stop(self) -> None:
        """Kill the emulator's whole process group (launcher script and Java server)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        tree = platform.current().contain(proc.pid)
        tree.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            tree.kill()
            proc.wait(10)
        # The launcher may have exited first: make sure nothing of the group survives.
        tree.kill()
        tree.close()
        if self._log is not None:
            shutil.rmtree(self._log.parent, ignore_errors=True)

    def restart(self) -> None:
        self.stop()
        self.start()


class Admin:
    """Topic/subscription management and pulling, through the real client library."""

    def __init__(self, emulator: Emulator) -> None:
        from google.cloud import pubsub_v1  # type: ignore[import-untyped]

        self.emulator = emulator
        self.publisher = pubsub_v1.PublisherClient()
        self.subscriber = pubsub_v1.SubscriberClient()

    def topic_path(self, name: str) -> str:
        path: str = self.publisher.topic_path(PROJECT, name)
        return path

    def subscription_path(self, name: str) -> str:
        path: str = self.subscriber.subscription_path(PROJECT, name)
        return path

    def create(self, topic: str, subscription: str, ordering: bool = True) -> None:
        """Create `topic` and an ordered pull `subscription` on it (full paths)."""
        self.publisher.create_topic(name=topic)
        self.subscriber.create_subscription(
            request={"name": subscription, "topic": topic, "enable_message_ordering": ordering}
        )

    def _pull_once(self, subscription: str, timeout: float) -> list[Any]:
        """One pull of up to 100 messages, acknowledged; [] when none came within `timeout`."""
        from google.api_core import exceptions as gexc

        try:
            response = self.subscriber.pull(
                request={"subscription": subscription, "max_messages": 100}, timeout=timeout
            )
        except gexc.DeadlineExceeded:
            return []
        received = list(response.received_messages)
        if received:
            self.subscriber.acknowledge(
                request={"subscription": subscription, "ack_ids": [m.ack_id for m in received]}
            )
        return [m.message for m in received]

    def pull(self, subscription: str, count: int, timeout: float = 15.0) -> list[Any]:
        """Pull and ack until `count` messages arrived (fails on timeout), in delivery order."""
        messages: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(messages) < count:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"only {len(messages)} of {count} messages arrived within {timeout}s"
                )
            messages.extend(self._pull_once(subscription, 5.0))
        return messages

    def drain(self, subscription: str, seconds: float = 1.0) -> list[Any]:
        """Whatever else arrives within `seconds` (to prove nothing extra was delivered)."""
        messages: list[Any] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            messages.extend(self._pull_once(subscription, 1.0))
        return messages

    def close(self) -> None:
        self.publisher.stop()
        self.subscriber.close()


@pytest.fixture(scope="session")
def pubsub_emulator() -> Iterator[Emulator]:
    """A running emulator for the session, with PUBSUB_EMULATOR_HOST pointing at it."""
    script = find_script()
    if script is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(INSTALL_HELP)
        pytest.skip(INSTALL_HELP)
    emulator = Emulator(script)
    emulator.start()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PUBSUB_EMULATOR_HOST", emulator.host)
        try:
            yield emulator
        finally:
            emulator.stop()


@dataclass
class Topic:
    """A fresh topic and ordered subscription on a running emulator, for one test."""

    emulator: Emulator
    admin: Admin
    topic: str
    subscription: str

    def recreate(self) -> None:
        """After an emulator restart (state is in memory): create both again."""
        self.admin.create(self.topic, self.subscription)

    def pull(self, count: int, timeout: float = 15.0) -> list[Any]:
        return self.admin.pull(self.subscription, count, timeout)

    def drain(self, seconds: float = 1.0) -> list[Any]:
        return self.admin.drain(self.subscription, seconds)


@pytest.fixture
def pubsub_topic(pubsub_emulator: Emulator) -> Iterator[Topic]:
    """Fresh topic + subscription; restarts the emulator if the previous test stopped it."""
    if not pubsub_emulator.running:
        pubsub_emulator.start()
    admin = Admin(pubsub_emulator)
    topic = Topic(
        pubsub_emulator,
        admin,
        admin.topic_path(unique("events")),
        admin.subscription_path(unique("audit")),
    )
    topic.recreate()
    try:
        yield topic
    finally:
        if not pubsub_emulator.running:
            pubsub_emulator.start()  # leave a running server for the next test
        admin.close()
