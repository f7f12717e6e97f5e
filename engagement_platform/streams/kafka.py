"""Thin Kafka client over confluent-kafka: watermarks, exact offset-range reads, producing.

Positions are assigned and sought explicitly; no consumer-group commit is ever the source of truth
(the Delta txn version is). Configuration is plain librdkafka config, so production only changes
`bootstrap.servers` (plus security settings passed through `extra`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import confluent_kafka
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from engagement_platform.settings import load_settings
from engagement_platform.streams.gc_pause import no_cyclic_gc


@dataclass(frozen=True)
class OffsetRange:
    """Half-open range [start, end) of one partition."""

    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Message:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


def _consumer_config(bootstrap: str, extra: dict | None) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": "engagement-platform-reader",  # required by librdkafka; never committed
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        # Brokers may answer with more than one fetch's worth; never stall on a large response.
        "receive.message.max.bytes": 2147483647,
        **(extra or {}),
    }


class ReplacingProducer:
    """A producer for long-lived senders (the demo traffic; the soak's workload). librdkafka's idempotent producer
    fails fatally, for good, when the broker's view of its sequence numbers breaks, e.g. a broker that lost its
    producer state in a restart (OUT_OF_ORDER_SEQUENCE_NUMBER, as the local broker does). Then this
    starts a new producer (`new`) and sends the old one's unreported messages again: at least once, so a copy may
    land twice, as with any producer retry; each message's `on_delivery` hears of the copy that was reported.
    `replaced` says why and when it happened. BufferError (the local queue is full) reaches the caller, as from
    a Producer."""

    def __init__(self, new: Callable[[], Producer]):
        self.new, self.producer = new, new()
        self.in_flight: dict[int, tuple] = {}  # this producer's unreported messages by send number: produce's arguments
        self.sent = 0
        self.replaced: list[str] = []

    def produce(self, topic: str, value: bytes, key: bytes | None = None, on_delivery: Callable | None = None) -> None:
        self.sent += 1
        number, in_flight = self.sent, self.in_flight

        def delivered(err: KafkaError | None, msg: confluent_kafka.Message) -> None:
            if in_flight.pop(number, None) is not None and on_delivery is not None:
                on_delivery(err, msg)

        in_flight[number] = (topic, value, key, on_delivery)
        try:
            self.producer.produce(topic, value=value, key=key, on_delivery=delivered)
        except BufferError:
            del in_flight[number]
            raise
        except KafkaException as exc:
            self._replace(exc)  # sends this one again too

    def poll(self, timeout: float = 0) -> None:
        try:
            self.producer.poll(timeout)
        except KafkaException as exc:
            self._replace(exc)

    def flush(self, timeout: float = 10) -> int:
        try:
            return self.producer.flush(timeout)
        except KafkaException as exc:
            self._replace(exc)
            return self.producer.flush(timeout)

    def _replace(self, exc: KafkaException) -> None:
        error = exc.args[0] if exc.args else None
        if not (isinstance(error, KafkaError) and error.fatal()):
            raise exc
        again = list(self.in_flight.values())
        self.replaced.append(
            f"{time.strftime('%H:%M:%S')}: the producer failed fatally ({error.str()[:160]}); "
            f"a new one sends its {len(again)} unreported messages again"
        )
        self.producer, self.in_flight = self.new(), {}  # the old one is never polled again: its reports never come
        for args in again:
            self.produce(*args)


class KafkaClient:
    def __init__(self, bootstrap_servers: str, extra_config: dict | None = None):
        """`extra_config`: librdkafka settings (security.protocol, sasl.*, ssl.*); None = the deployment's
        (settings.kafka_config, from KAFKA_CONFIG_*). Spark tasks get theirs from the driver, explicitly."""
        self.bootstrap_servers = bootstrap_servers
        self.extra_config = load_settings().kafka_config if extra_config is None else extra_config

    def _admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap_servers, **self.extra_config})

    def create_topics(
        self, topics: dict[str, int], replication: int = 1, timeout: float = 30, config: dict[str, str] | None = None
    ) -> None:
        """Create missing topics (name -> partition count) with the topic `config` (e.g. retention.ms); existing
        ones keep their partitions, and get `config` set where the broker allows it."""
        admin = self._admin()
        existing = set(admin.list_topics(timeout=timeout).topics)
        new = [
            NewTopic(t, num_partitions=n, replication_factor=replication, config=dict(config or {}))
            for t, n in topics.items()
            if t not in existing
        ]
        if config and existing & set(topics):
            self._alter_topic_config(admin, sorted(existing & set(topics)), config, timeout)
        for _topic, future in (admin.create_topics(new) if new else {}).items():
            try:
                future.result(timeout)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        deadline = time.monotonic() + timeout
        while not set(topics) <= set(admin.list_topics(timeout=timeout).topics):
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics not visible after {timeout}s: {sorted(topics)}")
            time.sleep(0.2)

    @staticmethod
    def _alter_topic_config(admin: AdminClient, topics: list[str], config: dict[str, str], timeout: float) -> None:
        resources = [
            ConfigResource(
                ConfigResource.Type.TOPIC,
                t,
                incremental_configs=[
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in config.items()
                ],
            )
            for t in topics
        ]
        for resource, future in admin.incremental_alter_configs(resources).items():
            try:
                future.result(timeout)
            except KafkaException as exc:  # a broker that refuses: the topic keeps its settings, say so
                print(f"topic {resource.name}: could not set {config}: {exc}")

    def partitions(self, topic: str, timeout: float = 10) -> list[int]:
        meta = self._admin().list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            raise LookupError(f"topic {topic!r} not found on {self.bootstrap_servers}: {meta and meta.error}")
        return sorted(meta.partitions)

    def watermarks(self, topic: str, timeout: float = 10) -> dict[int, tuple[int, int]]:
        """partition -> (low, high) watermark, asked of the broker (not cached)."""
        consumer = Consumer(_consumer_config(self.bootstrap_servers, self.extra_config))
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False)
                for p in self.partitions(topic, timeout)
            }
        finally:
            consumer.close()

    def read_range(self, topic: str, ranges: Iterable[OffsetRange], timeout: float = 60) -> Iterator[Message]:
        """Yield exactly the messages of each [start, end) range, in offset order per partition."""
        for chunk in self.fetch(topic, ranges, timeout):
            for m in chunk:
                yield Message(m.partition(), m.offset(), m.key(), m.value(), m.timestamp()[1])

    def fetch(self, topic: str, ranges: Iterable[OffsetRange], timeout: float = 60) -> Iterator[list]:
        """Chunks of raw confluent-kafka messages, exactly the offsets of each [start, end) range.

        The hot path of ingestion: no per-message Python object beyond librdkafka's own.
        """
        wanted = {r.partition: r for r in ranges if r.size > 0}
        if not wanted:
            return
        consumer = Consumer(_consumer_config(self.bootstrap_servers, self.extra_config))
        consumer.assign([TopicPartition(topic, r.partition, r.start) for r in wanted.values()])
        next_offset = {p: r.start for p, r in wanted.items()}
        deadline = time.monotonic() + timeout
        try:
            with no_cyclic_gc():  # the fetch loop allocates millions of small objects
                while next_offset:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{topic}: still missing offsets {next_offset} of {wanted}")
                    chunk = []
                    # Ask for no more than what is left: consume() waits out its timeout when it cannot
                    # fill num_messages, which would add a full timeout to every range's last chunk.
                    remaining = sum(wanted[p].end - o for p, o in next_offset.items())
                    for msg in consumer.consume(num_messages=min(20000, remaining), timeout=1.0):
                        err = msg.error()
                        if err is not None:
                            if err.code() == KafkaError._PARTITION_EOF:
                                continue
                            raise KafkaException(err)
                        p, offset = msg.partition(), msg.offset()
                        if p is None or offset is None:  # only messages that carry an error lack them
                            continue
                        if p not in next_offset or offset < next_offset[p] or offset >= wanted[p].end:
                            continue
                        next_offset[p] = offset + 1
                        chunk.append(msg)
                        if offset + 1 >= wanted[p].end:
                            del next_offset[p]
                            consumer.incremental_unassign([TopicPartition(topic, p)])
                    if chunk:
                        yield chunk
                    # Compacted or aborted-transaction offsets never arrive: past `end` means done.
                    for p in list(next_offset):
                        if consumer.position([TopicPartition(topic, p)])[0].offset >= wanted[p].end:
                            del next_offset[p]
        finally:
            consumer.close()

    def producer(self, **config: Any) -> Producer:
        return Producer(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "enable.idempotence": True,
                "linger.ms": 20,
                "batch.num.messages": 10000,
                "queue.buffering.max.messages": 1000000,
                **self.extra_config,
                **config,
            }
        )

    def produce(
        self, topic: str, records: Iterable[tuple[bytes | None, bytes]], partition: int | None = None
    ) -> dict[int, int]:
        """Produce (key, value) pairs, flush, and return partition -> next offset seen in delivery reports."""
        producer = self.producer()
        last: dict[int, int] = {}
        errors: list[str] = []

        def on_delivery(err: KafkaError | None, msg: confluent_kafka.Message) -> None:
            if err is not None:
                errors.append(str(err))
                return
            p, offset = msg.partition(), msg.offset()
            if p is not None and offset is not None:  # a delivered message has both
                last[p] = max(last.get(p, -1), offset + 1)

        for key, value in records:
            while True:
                try:
                    if partition is None:
                        producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                    else:
                        producer.produce(topic, value=value, key=key, on_delivery=on_delivery, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
        remaining = producer.flush(60)
        if errors or remaining:
            raise KafkaException(f"produce to {topic} failed: {remaining} undelivered, errors {errors[:3]}")
        return last
