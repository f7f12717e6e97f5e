"""ReplacingProducer (streams/kafka.py): when the idempotent producer fails fatally, a new one sends every message
the old one had not reported, and each message's callback hears of exactly one copy. A fatal producer error
cannot be caused on demand with a real broker (the local one lost its producer state in a restart once, in a
soak), so a stand-in producer raises it: only the replacement's bookkeeping is under test here."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from engagement_platform.streams.kafka import ReplacingProducer


class StandIn:
    """Queues what it is given and reports it on poll, with offsets from 0; `fails` raises a KafkaError instead."""

    def __init__(self, fails: KafkaError | None = None):
        self.fails, self.queued = fails, []

    def produce(self, topic, value, key, on_delivery):
        self.queued.append((value, on_delivery))

    def poll(self, timeout):
        if self.fails is not None:
            raise KafkaException(self.fails)
        for offset, (value, on_delivery) in enumerate(self.queued):
            on_delivery(None, Delivered(offset, value))
        self.queued = []

    def flush(self, timeout):
        self.poll(timeout)
        return 0


class Delivered:
    def __init__(self, offset: int, value: bytes):
        self._offset, self._value = offset, value

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value


FATAL = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence desynchronization", fatal=True)


def test_a_fatally_failed_producer_is_replaced_and_its_unreported_messages_sent_again_once():
    made = [StandIn(fails=FATAL), StandIn()]
    producer = ReplacingProducer(lambda: made.pop(0))
    heard: list[bytes] = []
    for i in range(3):
        producer.produce("t", f"m{i}".encode(), on_delivery=lambda err, msg: heard.append(msg.value()))
    producer.poll(0)  # the first producer fails: the second gets all three
    assert len(producer.replaced) == 1 and "3 unreported messages" in producer.replaced[0] and heard == []
    producer.produce("t", b"m3", on_delivery=lambda err, msg: heard.append(msg.value()))
    assert producer.flush(1) == 0
    assert heard == [b"m0", b"m1", b"m2", b"m3"] and not producer.in_flight


def test_an_error_that_is_not_fatal_is_raised_as_from_a_producer():
    producer = ReplacingProducer(lambda: StandIn(fails=KafkaError(KafkaError._TRANSPORT, "down")))
    producer.produce("t", b"m")
    with pytest.raises(KafkaException):
        producer.poll(0)
    assert not producer.replaced
