"""librdkafka's built-in mock cluster as a test server, and a real consumer to read it back.

The mock cluster is librdkafka's own broker implementation (the one its test suite uses),
shipped inside the confluent-kafka wheel. ``test.mock.num.brokers`` would tie a cluster to
one client; we start it through librdkafka's public mock API (``rd_kafka_mock_*`` in
``rdkafka_mock.h``) with ctypes instead, so that the sink, a consumer and the test share one
cluster, and so that a test can take brokers down and up, and make a topic refuse writes.
Nothing of ours stands in for Kafka: every byte goes through real brokers and real clients.
"""

from __future__ import annotations

import ctypes
import glob
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest

INSTALL_HELP = (
    "The Kafka sink tests need confluent-kafka with its bundled librdkafka "
    "(`pip install -e '.[kafka]'`, which `make install` does)."
)
#: Kafka protocol error codes used by the tests (see Kafka's protocol guide).
TOPIC_AUTHORIZATION_FAILED = 29


def library() -> ctypes.CDLL | None:
    """The librdkafka that confluent-kafka loaded (the same shared object, so the same code)."""
    try:
        import confluent_kafka
    except ImportError:
        return None
    package = os.path.dirname(confluent_kafka.__file__)
    candidates = glob.glob(os.path.join(package, os.pardir, "confluent_kafka.libs", "librdkafka*"))
    if not candidates:
        return None  # a build against a system librdkafka: not bundled, not found here
    lib = ctypes.CDLL(candidates[0])
    void, text, i32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "rd_kafka_conf_new": (void, []),
        "rd_kafka_conf_set": (ctypes.c_int, [void, text, text, text, ctypes.c_size_t]),
        "rd_kafka_new": (void, [ctypes.c_int, void, text, ctypes.c_size_t]),
        "rd_kafka_destroy": (None, [void]),
        "rd_kafka_mock_cluster_new": (void, [void, ctypes.c_int]),
        "rd_kafka_mock_cluster_destroy": (None, [void]),
        "rd_kafka_mock_cluster_bootstraps": (text, [void]),
        "rd_kafka_mock_topic_create": (ctypes.c_int, [void, text, ctypes.c_int, ctypes.c_int]),
        "rd_kafka_mock_topic_set_error": (None, [void, text, ctypes.c_int]),
        "rd_kafka_mock_broker_set_down": (ctypes.c_int, [void, i32]),
        "rd_kafka_mock_broker_set_up": (ctypes.c_int, [void, i32]),
        "rd_kafka_mock_group_initial_rebalance_delay_ms": (None, [void, i32]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


@dataclass
class MockCluster:
    """A running mock cluster of `brokers` brokers (ids 1..n) on loopback ports."""

    lib: ctypes.CDLL
    brokers: int = 3
    bootstrap: str = ""
    _handle: int | None = None
    _cluster: int | None = None
    topics: list[str] = field(default_factory=list)

    def start(self) -> None:
        conf = self.lib.rd_kafka_conf_new()
        error = ctypes.create_string_buffer(512)
        # The cluster's own (idle) client: quiet, it has nothing to connect to.
        self.lib.rd_kafka_conf_set(conf, b"log_level", b"0", error, 512)
        self._handle = self.lib.rd_kafka_new(0, conf, error, 512)
        if not self._handle:
            raise RuntimeError(f"rd_kafka_new: {error.value.decode()}")
        self._cluster = self.lib.rd_kafka_mock_cluster_new(self._handle, self.brokers)
        if not self._cluster:
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        self.bootstrap = self.lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()
        # A group's first join waits 3 s for more members by default (as brokers do).
        self.lib.rd_kafka_mock_group_initial_rebalance_delay_ms(self._cluster, 0)

    def stop(self) -> None:
        cluster, self._cluster = self._cluster, None
        handle, self._handle = self._handle, None
        if cluster:
            self.lib.rd_kafka_mock_cluster_destroy(cluster)
        if handle:
            self.lib.rd_kafka_destroy(handle)

    def create_topic(self, name: str | None = None, partitions: int = 4) -> str:
        topic = name or f"events-{uuid.uuid4().hex[:10]}"
        code = self.lib.rd_kafka_mock_topic_create(
            self._cluster, topic.encode(), partitions, min(3, self.brokers)
        )
        assert code == 0, f"rd_kafka_mock_topic_create({topic}) = {code}"
        self.topics.append(topic)
        return topic

    def refuse_writes(self, topic: str) -> None:
        """From now on the topic answers TOPIC_AUTHORIZATION_FAILED (as with a missing ACL)."""
        self.lib.rd_kafka_mock_topic_set_error(
            self._cluster, topic.encode(), TOPIC_AUTHORIZATION_FAILED
        )

    def down(self) -> None:
        """Every broker closes its connections and refuses new ones (the cluster is gone)."""
        for broker in range(1, self.brokers + 1):
            self.lib.rd_kafka_mock_broker_set_down(self._cluster, broker)

    def up(self) -> None:
        for broker in range(1, self.brokers + 1):
            self.lib.rd_kafka_mock_broker_set_up(self._cluster, broker)


class Reader:
    """A real `confluent_kafka.Consumer` reading every partition of a topic from the start.

    It assigns the partitions itself (no group membership, so no rebalance delay): the
    tests read what the sink wrote; consumer groups are tested where they are the point.
    """

    def __init__(self, cluster: MockCluster, topic: str) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.consumer = Consumer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "log_level": 3,
            }
        )
        partitions = self.consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])

    def read(self, count: int, timeout: float = 30.0) -> list[Any]:
        """`count` messages (fails on timeout), each partition in its order."""
        messages: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(messages) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(messages)} of {count} messages within {timeout}s")
            messages.extend(self._poll(0.5))
        return messages

    def drain(self, seconds: float = 1.0) -> list[Any]:
        """Whatever else arrives within `seconds` (to prove nothing extra was produced)."""
        messages: list[Any] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            messages.extend(self._poll(0.2))
        return messages

    def _poll(self, timeout: float) -> list[Any]:
        message = self.consumer.poll(timeout)
        if message is None:
            return []
        error = message.error()
        if error is not None:
            if error.retriable() or error.name() == "_PARTITION_EOF":
                return []
            raise AssertionError(f"consumer error: {error.name()}: {error.str()}")
        return [message]

    def close(self) -> None:
        self.consumer.close()


def require_library() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(INSTALL_HELP)
        pytest.skip(INSTALL_HELP)
    return lib
