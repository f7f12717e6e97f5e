"""A planned Kafka slice through the fast path (fast_path.py) inside Spark tasks, and what it leaves to Spark.

The driver cuts the slice's offset ranges into one share per task (`task_shares`). A task reads its share
with confluent-kafka and decides each record (`decide_share`); the undecided records (bad ones, odd forms)
go, with their raw bytes and positions, into an Arrow file of the run's handoff folder. `undecided_rows`
reads those files back in Spark tasks as the parse stage's input rows, so the Spark pipeline handles them
as it would have handled the whole slice: neither the decided nor the undecided rows pass the driver.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from engagement_platform.ingest.errors import RAW, ROW_ID, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.fast_path import FastPath
from engagement_platform.ingest.sources import KAFKA_PARTITION_SHIFT
from engagement_platform.spark.handoff_files import read_handoff
from engagement_platform.streams.gc_pause import no_cyclic_gc
from engagement_platform.streams.kafka import KafkaClient, OffsetRange

Share = list[tuple[int, int, int]]  # (partition, start, end) ranges one task reads
UNDECIDED_SCHEMA = pa.schema([(ROW_ID, pa.int64()), (SOURCE_PARTITION, pa.int32()), (SOURCE_OFFSET, pa.int64()), (RAW, pa.binary())])
UNDECIDED_DDL = f"{ROW_ID} long, {SOURCE_PARTITION} int, {SOURCE_OFFSET} long, {RAW} binary"
MIN_SHARE = 20_000  # fewer records per task cost more in task start-up than they save


def task_shares(ranges: list[OffsetRange], tasks: int) -> list[Share]:
    """The ranges cut into at most `tasks` shares of about the same number of records (at least MIN_SHARE
    each), in partition and offset order; one empty share when there is nothing to read."""
    total = sum(r.size for r in ranges)
    count = max(1, min(tasks, total // MIN_SHARE))
    per_share = -(-total // count) if total else 0
    shares: list[Share] = [[]]
    room = per_share
    for r in ranges:
        start = r.start
        while start < r.end:
            if room == 0:
                shares.append([])
                room = per_share
            end = min(r.end, start + room)
            shares[-1].append((r.partition, start, end))
            room -= end - start
            start = end
    return shares


def decide_share(fast: FastPath, client: KafkaClient, topic: str, share: Share,
                 seconds: dict[str, float] | None = None) -> tuple[pa.Table, pa.Table]:
    """(the share's decided rows in fast.schema(), its undecided records in UNDECIDED_SCHEMA); the time spent
    reading and deciding is added to `seconds` ("read", "decide")."""
    seconds = {} if seconds is None else seconds
    decided, undecided = [], []
    with no_cyclic_gc():  # millions of short-lived dicts: the cycle collector would only rescan them
        for partition, start, end in share:
            chunks = client.fetch(topic, [OffsetRange(partition, start, end)])
            while True:
                t = time.perf_counter()
                chunk = next(chunks, None)
                seconds["read"] = seconds.get("read", 0.0) + time.perf_counter() - t
                if chunk is None:
                    break
                t = time.perf_counter()
                offsets = [m.offset() for m in chunk]
                values = [m.value() for m in chunk]
                table, left = fast.decide(partition, offsets, values)
                seconds["decide"] = seconds.get("decide", 0.0) + time.perf_counter() - t
                decided.append(table)
                if left:
                    undecided.append(pa.table({
                        ROW_ID: pa.array([(partition << KAFKA_PARTITION_SHIFT) + offsets[i] for i in left], pa.int64()),
                        SOURCE_PARTITION: pa.array([partition] * len(left), pa.int32()),
                        SOURCE_OFFSET: pa.array([offsets[i] for i in left], pa.int64()),
                        RAW: pa.array([values[i] for i in left], pa.binary()),
                    }, schema=UNDECIDED_SCHEMA))
    return (pa.concat_tables(decided) if decided else fast.schema().empty_table(),
            pa.concat_tables(undecided) if undecided else UNDECIDED_SCHEMA.empty_table())


def undecided_rows(spark: SparkSession, uris: list[str], storage_options: Mapping[str, str] | None = None) -> DataFrame:
    """The undecided records' handoff files as the parse stage's input rows (sources.parse_text), read in
    Spark tasks, one file per task."""
    return spark.range(len(uris), numPartitions=len(uris)).mapInArrow(_read_files(uris, dict(storage_options or {})), UNDECIDED_DDL)


def _read_files(uris: list[str], storage_options: dict) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from read_handoff(uris[index], storage_options).to_batches()

    return run
