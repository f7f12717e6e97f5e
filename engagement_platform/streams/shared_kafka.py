"""One Kafka client per process for the questions sensor ticks ask on every tick (no Dagster).

`KafkaClient.watermarks` opens a consumer and an admin client, asks, and closes both: two librdkafka instances
per call, each starting its threads, connecting to the bootstrap servers and fetching metadata before it can
answer, on every tick of every stream sensor. `shared_kafka_client(servers)` answers the same questions
(`partitions`, `watermarks`, both asked of the broker on every call, never from a cache) from one long-lived
consumer per bootstrap servers and client settings; every other method (reads, producing, creating topics) is
KafkaClient's own.

Threads: librdkafka's handles are thread-safe and confluent-kafka releases the GIL while it waits, so the sensor
threads share the consumer; a lock guards only its creation. A consumer whose handle failed fatally is replaced
on the next call; one that merely cannot reach the broker is kept (librdkafka reconnects by itself). A forked
child starts with no client: it never uses, closes or frees its parent's consumers (librdkafka's threads do not
survive a fork).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from engagement_platform.settings import load_settings
from engagement_platform.streams.kafka import KafkaClient

# The metadata consumer never subscribes, so it never joins or commits to its group (librdkafka requires one).
GROUP_ID = "engagement-platform-reader"

_registry_lock = threading.Lock()
_clients: dict[tuple[str, tuple[tuple[str, str], ...]], SharedKafkaClient] = {}
_last_used: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
IDLE_CLOSE_S = 300.0  # sensors ask every 5-30 s: a client unused this long belongs to a cluster nobody reads


class SharedKafkaClient(KafkaClient):
    """A KafkaClient whose metadata questions go to one long-lived consumer."""

    def __init__(self, bootstrap_servers: str, extra_config: dict | None = None):
        super().__init__(bootstrap_servers, extra_config)
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None

    def partitions(self, topic: str, timeout: float = 10) -> list[int]:
        consumer = self._metadata_consumer()
        try:
            meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as e:
            self._forget_if_fatal(consumer, e)
            raise
        if meta is None or meta.error is not None:
            raise LookupError(f"topic {topic!r} not found on {self.bootstrap_servers}: {meta and meta.error}")
        return sorted(meta.partitions)

    def watermarks(self, topic: str, timeout: float = 10) -> dict[int, tuple[int, int]]:
        """partition -> (low, high) watermark, asked of the broker (not cached)."""
        partitions = self.partitions(topic, timeout)
        consumer = self._metadata_consumer()
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False)
                for p in partitions
            }
        except KafkaException as e:
            self._forget_if_fatal(consumer, e)
            raise

    def _metadata_consumer(self) -> Consumer:
        with self._lock:
            if self._consumer is None:
                # A kept connection that the broker closes when idle is reconnected on the next call: not worth a
                # log line every few minutes.
                self._consumer = Consumer(
                    {
                        "bootstrap.servers": self.bootstrap_servers,
                        "group.id": GROUP_ID,
                        "log.connection.close": False,
                        # A broker that is away is tried again once a second, not every 50-100 ms with an error
                        # line each time (librdkafka's default): sensors ask every 5-30 s.
                        "reconnect.backoff.ms": 1000,
                        **self.extra_config,
                    }
                )
            return self._consumer

    def close(self) -> None:
        """Close the kept consumer (the registry does, once nobody asked for this client in IDLE_CLOSE_S)."""
        with self._lock:
            consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def _forget_if_fatal(self, consumer: Consumer, error: KafkaException) -> None:
        """After a fatal error the next call creates another consumer. This one is not closed here (another thread
        may be using it): it is freed with its last reference."""
        kafka_error = error.args[0] if error.args else None
        if isinstance(kafka_error, KafkaError) and kafka_error.fatal():
            with self._lock:
                if self._consumer is consumer:
                    self._consumer = None


def shared_kafka_client(bootstrap_servers: str, extra_config: dict | None = None) -> SharedKafkaClient:
    """The process's client for these servers and librdkafka settings (None: the deployment's, settings.kafka_config).

    A client nobody asked for in IDLE_CLOSE_S is closed on the next call for any client: a consumer kept for a
    cluster that is gone (settings changed, a test's broker stopped) would otherwise reconnect and log for as long
    as the process lives."""
    config = load_settings().kafka_config if extra_config is None else extra_config
    key = (bootstrap_servers, tuple(sorted((str(k), str(v)) for k, v in config.items())))
    now = time.monotonic()
    with _registry_lock:
        for idle_key in [k for k, used in _last_used.items() if now - used > IDLE_CLOSE_S and k != key]:
            _last_used.pop(idle_key, None)
            idle = _clients.pop(idle_key, None)
            if idle is not None:
                idle.close()
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = SharedKafkaClient(bootstrap_servers, dict(config))
        _last_used[key] = now
        return client


def after_fork() -> None:
    """In a forked child: start with no client. The parent's consumers are never freed here: freeing one destroys
    its librdkafka handle, which joins threads the child does not have."""
    global _registry_lock
    for client in _clients.values():
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(client))
    _clients.clear()
    _last_used.clear()
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=after_fork)
