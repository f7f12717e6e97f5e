"""Kafka's side of status: per topic its watermarks, the stream's records not committed and not planned, and
the time of the oldest record not committed (read with a short timeout: the lag in seconds). Once the broker
does not answer, every later question returns UNAVAILABLE at once. Reads only: assigned offsets, no group."""

from __future__ import annotations

from datetime import datetime

from confluent_kafka import KafkaException

from engagement_platform.status.lake import Latest
from engagement_platform.status.report import UNAVAILABLE, Lag, Service, planned_lag, why
from engagement_platform.streams.kafka import KafkaClient, OffsetRange
from engagement_platform.streams.planning import KafkaSlice, uncommitted_records

KAFKA_TIMEOUT_S = 3.0  # one metadata / watermark request; past it the broker counts as away
RECORD_TIMEOUT_S = 5.0  # reading the oldest uncommitted record of each partition


class KafkaProbe:
    """Watermarks per topic; once the broker does not answer, every later question returns UNAVAILABLE at once."""

    def __init__(self, servers: str, config: dict[str, str]):
        self.servers, self.asked = servers, False
        self.error: str | None = None
        # The deployment's client settings (security); librdkafka's own log lines about a broker that is away
        # would bury the report, which says it once.
        self.config = {**config, "log_level": "0"}
        self.marks: dict[str, dict[int, tuple[int, int]] | str] = {}

    @property
    def service(self) -> Service:
        return Service("kafka", self.error is None if self.asked else None, self.error or self.servers)

    def watermarks(self, topic: str) -> dict[int, tuple[int, int]] | str:
        if self.error is not None:
            return UNAVAILABLE
        if topic not in self.marks:
            self.asked = True
            try:
                self.marks[topic] = KafkaClient(self.servers, self.config).watermarks(topic, timeout=KAFKA_TIMEOUT_S)
            except LookupError:
                self.marks[topic] = f"no topic {topic}"
            except (KafkaException, TimeoutError) as e:
                self.error = why(e)
                return UNAVAILABLE
        return self.marks[topic]

    def oldest_record_ms(self, topic: str, positions: dict[int, int], marks: dict[int, tuple[int, int]]) -> int | None:
        """The timestamp of the oldest record at or after `positions` (partition -> offset); None if unknown."""
        ranges = []
        for partition, (low, high) in sorted(marks.items()):
            start = max(positions.get(partition, low), low)
            if high > start:
                ranges.append(OffsetRange(partition, start, start + 1))
        if not ranges or self.error is not None:
            return None
        try:
            times = [
                m.timestamp_ms
                for m in KafkaClient(self.servers, self.config).read_range(topic, ranges, RECORD_TIMEOUT_S)
            ]
        except (KafkaException, TimeoutError):
            return None
        times = [t for t in times if t > 0]
        return min(times) if times else None


def kafka_lag(kafka: KafkaProbe, topic: str, latest: Latest, now: datetime) -> Lag:
    """Records on the topic the stream has not committed (and not planned), and how old the oldest of them is."""
    batch = latest.batch
    if isinstance(batch, str):  # without the checkpoint store, where the stream stands is not known
        return Lag(UNAVAILABLE, UNAVAILABLE, UNAVAILABLE)
    marks = kafka.watermarks(topic)
    if isinstance(marks, str):  # the broker away, or no such topic: only an unfinished batch's age is known
        fallback = planned_lag(batch, now, marks)
        return fallback if fallback.seconds is not None else Lag(marks, marks, marks)
    plan = latest.plan if latest.plan is not None and isinstance(latest.plan.slice, KafkaSlice) else None
    done = batch.state == "done"
    ends = plan.ends() if plan is not None else {}
    unplanned = sum(max(high - max(ends.get(p, low), low), 0) for p, (low, high) in marks.items())
    records = uncommitted_records(plan, done, marks)
    if not records:
        return Lag(0, unplanned, 0.0)
    if plan is None or done:
        positions = ends
    else:  # the batch in flight is not committed: its records count from its start
        positions = {r.partition: r.start for r in plan.ranges}
    oldest = kafka.oldest_record_ms(topic, positions, marks)
    if oldest is not None:
        return Lag(records, unplanned, max(now.timestamp() - oldest / 1000, 0.0), "the oldest uncommitted record")
    fallback = planned_lag(batch, now, records)  # the record's time was not readable: when its batch was planned
    seconds = fallback.seconds if fallback.seconds is not None else UNAVAILABLE
    return Lag(records, unplanned, seconds, fallback.seconds_from)
