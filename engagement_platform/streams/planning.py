"""Batch planning: which fixed slice of its source the next batch reads. Pure logic, no I/O.

A plan is fixed before its run starts and stored in the checkpoint store, so a retried run re-reads
exactly the same slice. Batch ids are consecutive per stream; they are the Delta txn versions. The
slice is typed by its source (streams/slices.py); Kafka plans also answer `topic`, `ranges`, `ends()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.slices import (
    FileSetSlice,
    FileSlice,
    KafkaSlice,
    S,
    Slice,
    SnapshotSlice,
    TableVersionsSlice,
    as_kind,
)

__all__ = [
    "BatchPlan",
    "FileSetSlice",
    "FileSlice",
    "KafkaSlice",
    "SnapshotSlice",
    "Slice",
    "TableVersionsSlice",
    "offset_gaps_and_overlaps",
    "plan_next_batch",
    "uncommitted_records",
]


@dataclass(frozen=True)
class BatchPlan:
    stream: str
    batch_id: int
    slice: Slice

    @property
    def partition_key(self) -> str:
        """Dynamic partition key: zero-padded so the UI sorts batches in order."""
        return f"{self.batch_id:08d}"

    @property
    def run_key(self) -> str:
        """Derived from the slice itself, so a re-evaluated tick cannot launch the batch twice."""
        return f"{self.stream}/{self.batch_id}/{self.slice.key}"

    @property
    def record_count(self) -> int:
        """Records the slice holds, known up front for Kafka offsets only (0 for the other kinds)."""
        return self.slice.record_count if isinstance(self.slice, KafkaSlice) else 0

    def slice_as(self, kind: type[S]) -> S:
        """The slice as the kind this stream plans (TypeError for any other kind)."""
        return as_kind(self.slice, kind)

    @property
    def kafka(self) -> KafkaSlice:
        if not isinstance(self.slice, KafkaSlice):
            raise TypeError(
                f"{self.stream} batch {self.batch_id} reads a {type(self.slice).__name__}, not Kafka offsets"
            )
        return self.slice

    @property
    def topic(self) -> str:
        return self.kafka.topic

    @property
    def ranges(self) -> tuple[OffsetRange, ...]:
        return self.kafka.ranges

    def ranges_json(self) -> str:
        return self.kafka.ranges_json()

    @staticmethod
    def ranges_from_json(text: str) -> tuple[OffsetRange, ...]:
        return KafkaSlice.ranges_from_json(text)

    def ends(self) -> dict[int, int]:
        return self.kafka.ends()


def plan_next_batch(
    stream: str,
    topic: str,
    previous: BatchPlan | None,
    watermarks: dict[int, tuple[int, int]],
    max_records_per_partition: int,
) -> BatchPlan | None:
    """The slice after `previous` up to the high watermarks, bounded per partition; None if nothing new.

    Every partition the topic has appears in the plan (empty ranges included) so the plan alone says
    where the next one starts. Offsets below the low watermark were deleted by retention and are skipped.
    """
    if max_records_per_partition <= 0:
        raise ValueError("max_records_per_partition must be positive")
    done = previous.ends() if previous else {}
    ranges = []
    for partition in sorted(watermarks):
        low, high = watermarks[partition]
        start = max(done.get(partition, low), low)
        end = max(start, min(high, start + max_records_per_partition))
        ranges.append(OffsetRange(partition, start, end))
    if not any(r.size for r in ranges):
        return None
    return BatchPlan(stream, (previous.batch_id + 1) if previous else 1, KafkaSlice(topic, tuple(ranges)))


def uncommitted_records(latest: BatchPlan | None, done: bool, watermarks: dict[int, tuple[int, int]]) -> int:
    """Messages on the topic that the stream has not committed yet (its lag in records): everything past the
    latest done batch's ends, or past the start of the latest batch while it is still in flight."""
    if latest is None or not isinstance(latest.slice, KafkaSlice):
        committed = {}
    else:
        committed = latest.ends() if done else {r.partition: r.start for r in latest.ranges}
    return sum(max(high - max(committed.get(p, low), low), 0) for p, (low, high) in watermarks.items())


def offset_gaps_and_overlaps(plans: list[BatchPlan]) -> tuple[int, int]:
    """(offsets never read, offsets read more than once) between the first and last offset planned,
    per partition, over all plans of one stream (a sweep over the ranges sorted by start)."""
    by_partition: dict[int, list[OffsetRange]] = {}
    for plan in plans:
        for r in plan.ranges:
            # Empty ranges count too: they mark where the stream stood (retention may skip past it).
            by_partition.setdefault(r.partition, []).append(r)
    gaps = overlaps = 0
    for ranges in by_partition.values():
        ranges.sort(key=lambda r: (r.start, r.end))
        covered_to = ranges[0].start
        for r in ranges:
            gaps += max(r.start - covered_to, 0)
            overlaps += max(min(r.end, covered_to) - r.start, 0)
            covered_to = max(covered_to, r.end)
    return gaps, overlaps
