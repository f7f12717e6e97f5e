"""Spark Python data source `kafka_offsets`: reads exact Kafka offset ranges inside Spark.

It stands in for spark-sql-kafka (whose jar cannot be installed here): each input partition is a
slice of one Kafka partition, read with confluent-kafka by assign + seek on an executor's Python
worker and returned as Arrow record batches, so Kafka data never passes through the client.

Only what the parse stage uses is read (partition, offset, value): every column costs a Python call
per message, and this loop is a large share of a slice's CPU (BENCHMARKS.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

if TYPE_CHECKING:
    import pyarrow as pa

SCHEMA = "kafka_partition int, kafka_offset long, value binary"
SLICE_SIZE = 1_000_000  # offsets per Spark task: split big ranges so both cores read


class OffsetSlice(InputPartition):
    def __init__(self, partition: int, start: int, end: int):
        self.partition, self.start, self.end = partition, start, end


def offset_slices(ranges: list[tuple[int, int, int]], slice_size: int = SLICE_SIZE) -> list[OffsetSlice]:
    """(partition, start, end) ranges cut into slices of at most `slice_size` offsets (at least one slice)."""
    slices = []
    for partition, start, end in ranges:
        for lo in range(start, end, slice_size):
            slices.append(OffsetSlice(partition, lo, min(end, lo + slice_size)))
    return slices or [OffsetSlice(0, 0, 0)]


def read_slice(bootstrap_servers: str, kafka_config: dict, topic: str, part: OffsetSlice) -> Iterator[pa.RecordBatch]:
    """One slice's messages as Arrow batches of (kafka_partition, kafka_offset, value)."""
    import pyarrow as pa

    from engagement_platform.streams.kafka import KafkaClient, OffsetRange

    client = KafkaClient(bootstrap_servers, kafka_config)
    for chunk in client.fetch(topic, [OffsetRange(part.partition, part.start, part.end)]):
        yield pa.RecordBatch.from_arrays(
            [
                pa.repeat(part.partition, len(chunk)).cast(pa.int32()),  # a slice is one partition
                pa.array([m.offset() for m in chunk], pa.int64()),
                pa.array([m.value() for m in chunk], pa.binary()),
            ],
            names=["kafka_partition", "kafka_offset", "value"],
        )


class KafkaOffsetsDataSource(DataSource):
    """Options: bootstrap_servers, topic, ranges (JSON [[partition, start, end], ...]),
    slice_size (split big ranges so both cores read), kafka_config (JSON, extra librdkafka config)."""

    @classmethod
    def name(cls) -> str:
        return "kafka_offsets"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaOffsetsReader(dict(self.options))


class KafkaOffsetsReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        self.bootstrap = options["bootstrap_servers"]
        self.topic = options["topic"]
        self.ranges = [(int(p), int(s), int(e)) for p, s, e in json.loads(options["ranges"])]
        self.slice_size = int(options.get("slice_size", str(SLICE_SIZE)))
        self.kafka_config = json.loads(options.get("kafka_config", "{}"))

    def partitions(self) -> list[OffsetSlice]:
        return offset_slices(self.ranges, self.slice_size)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part = cast(OffsetSlice, partition)  # one of those partitions() returned
        yield from read_slice(self.bootstrap, self.kafka_config, self.topic, part)
