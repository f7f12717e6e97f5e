"""One Kafka client per process for sensor ticks, with a fake consumer (no broker): one consumer for every call and
thread, a new one only after a fatal error, one client per servers and settings, none inherited by a forked child."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from engagement_platform.streams import shared_kafka
from engagement_platform.streams.shared_kafka import SharedKafkaClient, shared_kafka_client


class FakeConsumer:
    made: list[FakeConsumer] = []
    fail_with: KafkaError | None = None

    def __init__(self, config: dict):
        self.config = config
        self.closed = False
        FakeConsumer.made.append(self)

    def close(self) -> None:
        self.closed = True

    def list_topics(self, topic: str, timeout: float):
        if FakeConsumer.fail_with is not None:
            raise KafkaException(FakeConsumer.fail_with)
        partitions = {0: None, 1: None}
        meta = type("Topic", (), {"partitions": partitions, "error": None})()
        return type("Metadata", (), {"topics": {topic: meta}})()

    def get_watermark_offsets(self, partition, timeout: float, cached: bool):
        assert cached is False, "asked of the broker every time"
        return (0, 10 * (partition.partition + 1))


@pytest.fixture(autouse=True)
def fake_consumer(monkeypatch):
    monkeypatch.setattr(shared_kafka, "Consumer", FakeConsumer)
    monkeypatch.setattr(shared_kafka, "_clients", {})
    FakeConsumer.made, FakeConsumer.fail_with = [], None


def test_every_call_and_thread_shares_one_consumer():
    client = shared_kafka_client("broker:9092", {})
    assert client is shared_kafka_client("broker:9092", {})
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(client.watermarks("t"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [{0: (0, 10), 1: (0, 20)}] * 8
    assert len(FakeConsumer.made) == 1 and FakeConsumer.made[0].config["bootstrap.servers"] == "broker:9092"


def test_other_servers_or_settings_get_a_client_of_their_own():
    a = shared_kafka_client("broker:9092", {})
    assert shared_kafka_client("other:9092", {}) is not a
    secured = shared_kafka_client("broker:9092", {"security.protocol": "SASL_SSL"})
    assert secured is not a
    secured.partitions("t")
    assert FakeConsumer.made[-1].config["security.protocol"] == "SASL_SSL"


def test_a_fatal_error_replaces_the_consumer_and_a_passing_one_keeps_it():
    client = SharedKafkaClient("broker:9092", {})
    client.partitions("t")
    FakeConsumer.fail_with = KafkaError(KafkaError._TRANSPORT, "broker away")
    with pytest.raises(KafkaException):
        client.watermarks("t")
    FakeConsumer.fail_with = None
    client.watermarks("t")
    assert len(FakeConsumer.made) == 1, "librdkafka reconnects by itself"
    FakeConsumer.fail_with = KafkaError(KafkaError._FATAL, "fenced", fatal=True)
    with pytest.raises(KafkaException):
        client.partitions("t")
    FakeConsumer.fail_with = None
    assert client.watermarks("t") == {0: (0, 10), 1: (0, 20)} and len(FakeConsumer.made) == 2


def test_a_missing_topic_is_a_lookup_error():
    client = SharedKafkaClient("broker:9092", {})
    consumer = client._metadata_consumer()  # noqa: SLF001 - the test gives it an empty topic list
    consumer.list_topics = lambda topic, timeout: type("Metadata", (), {"topics": {}})()
    with pytest.raises(LookupError, match="not found"):
        client.partitions("missing")


def test_a_forked_child_starts_without_its_parents_clients():
    parent = shared_kafka_client("broker:9092", {})
    shared_kafka.after_fork()  # what os.fork runs in the child
    child = shared_kafka_client("broker:9092", {})
    assert child is not parent


def test_a_client_nobody_asked_for_in_the_idle_bound_is_closed_and_replaced(monkeypatch) -> None:
    gone, live = "127.0.0.1:1", "127.0.0.1:2"
    first = shared_kafka.shared_kafka_client(gone, {})
    kept = first._metadata_consumer()  # noqa: SLF001 - a kept consumer, as after a tick
    assert shared_kafka.shared_kafka_client(gone, {}) is first, "asked again within the bound: the same client"
    monkeypatch.setattr(shared_kafka, "IDLE_CLOSE_S", 0.0)
    shared_kafka.shared_kafka_client(live, {})  # any call sweeps the idle ones
    assert kept.closed and first._consumer is None, "the idle client's consumer is closed"  # noqa: SLF001
    assert shared_kafka.shared_kafka_client(gone, {}) is not first, "a later call gets a new client"
