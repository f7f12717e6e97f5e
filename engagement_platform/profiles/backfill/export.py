"""A backfill's export: its data files (JSON lines or Parquet, in a local folder or under an object-store
prefix) listed with their sizes, and read by Spark into the parse stage's layout.

Files on an object store are read in Spark tasks through pyarrow's file systems with the deployment's
storage options (JSON lines through the landing_lines source, Parquet here): Spark's own readers would
need Hadoop's S3 / ABFS connectors, which are not installed here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import LongType, StructField, StructType

from engagement_platform.ingest.errors import ERRORS, RAW, ROW_ID, SOURCE_OFFSET, SOURCE_PARTITION, gather
from engagement_platform.ingest.pipeline import Pipeline
from engagement_platform.ingest.sources import INPUT, read_lines_file
from engagement_platform.lake.file_writes import filesystem, join, read_parquet
from engagement_platform.settings import load_settings
from engagement_platform.spark.landing_source import file_version
from engagement_platform.streams.planning import BatchPlan, SnapshotSlice

SUFFIXES = {".jsonl", ".ndjson", ".json", ".parquet"}
FILE_SHIFT = 40  # row id = file index << 40 | line (or row) number: unique across the files of a batch
ROW_INDEX = "_row_index"  # a Parquet row's index in its file, when read through pyarrow


@dataclass(frozen=True)
class ExportFile:
    path: str
    size: int
    modified_ns: int | None  # None where the store reports no modification time


def snapshot_files(path: str | Path, storage_options: Mapping[str, str] | None = None) -> list[ExportFile]:
    """The export's data files: the file itself, or the folder's JSON lines / Parquet files, sorted (dot-files
    are uploads in flight). A local path or an object-store URI (the deployment's storage options)."""
    path = str(path)
    fs, where = filesystem(path, storage_options)
    info = fs.get_file_info(where)
    if info.is_file:
        return [ExportFile(path, info.size, info.mtime_ns)]
    if info.type != pafs.FileType.Directory:
        raise FileNotFoundError(f"snapshot export {path} does not exist")
    return sorted(
        (
            ExportFile(join(path, f.base_name), f.size, f.mtime_ns)
            for f in fs.get_file_info(pafs.FileSelector(where))
            if f.is_file and os.path.splitext(f.base_name)[1] in SUFFIXES and not f.base_name.startswith((".", "_"))
        ),
        key=lambda f: f.path,
    )


def _identity(files: list[ExportFile]) -> tuple[tuple[str, int, int | None], ...]:
    return tuple((f.path.rsplit("/", 1)[-1], f.size, f.modified_ns) for f in files)


def snapshot_slice(path: str | Path, until: datetime) -> SnapshotSlice:
    """The export as it is now: its resolved path, the boundary, each data file's name, size and modification
    time (its identity: a backfill of the same identity again is a no-op)."""
    path = str(path)
    resolved = path.rstrip("/") if "://" in path else str(Path(path).resolve())
    return SnapshotSlice(resolved, until, _identity(snapshot_files(resolved, load_settings().storage_options)))


def plan_files(plan: BatchPlan) -> list[str]:
    """The plan's files, checked unchanged since it was planned."""
    planned = plan.slice_as(SnapshotSlice)
    files = snapshot_files(planned.path, load_settings().storage_options)
    if not planned.same_export(SnapshotSlice(planned.path, planned.until, _identity(files))):
        raise RuntimeError(
            f"{planned.path} changed since backfill batch {plan.batch_id} was planned: exports must be complete and immutable"
        )
    return [f.path for f in files]


def _parquet_rows(spark: SparkSession, path: str) -> tuple[DataFrame, Column, list[str]]:
    """(the Parquet file's rows, each row's index in the file, the file's columns). A local file goes through Spark's reader; a
    file on an object store through pyarrow in a Spark task, since Spark's reader would need Hadoop's
    connectors (not installed here)."""
    if "://" not in path or path.startswith("file://"):
        # the file's version as an option: a Connect server's plan cache would otherwise keep an older listing
        df = spark.read.option("file_version", file_version(path)).parquet(path)
        return df, F.col("_metadata.row_index"), df.columns
    storage_options = load_settings().storage_options
    fs, where = filesystem(path, storage_options)
    with fs.open_input_file(where) as f:
        schema = pq.read_schema(f)
    struct = StructType([*from_arrow_schema(spark_compatible(schema)).fields, StructField(ROW_INDEX, LongType())])
    arrow = to_arrow_schema(struct, timezone="UTC")  # exactly the Arrow types Spark checks the task's batches against

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            task_fs, task_where = filesystem(path, storage_options)
            rows = read_parquet(task_fs, task_where)
            rows = rows.cast(spark_compatible(rows.schema), safe=False).append_column(
                ROW_INDEX, pa.array(range(rows.num_rows), pa.int64())
            )
            yield from rows.cast(arrow).to_batches()

    return spark.range(1, numPartitions=1).mapInArrow(read, struct), F.col(ROW_INDEX), schema.names


def spark_compatible(schema: pa.Schema) -> pa.Schema:
    """`schema` with the Arrow types Spark has no twin for replaced by ones it has, as Spark's Parquet reader
    would read them: dictionaries by their values, timestamps of any unit as microseconds (UTC when zoned),
    date64 as date32, unsigned integers as wider signed ones (uint64 as decimal(20,0)), times of day as text."""
    return pa.schema([field.with_type(_compatible(field.type)) for field in schema])


def _compatible(t: pa.DataType) -> pa.DataType:
    if pa.types.is_dictionary(t):
        return _compatible(t.value_type)
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_time(t):
        return pa.string()
    if pa.types.is_unsigned_integer(t):
        return pa.decimal128(20, 0) if t.bit_width == 64 else pa.int64()
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_compatible(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(t.value_field.with_type(_compatible(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(_compatible(t.key_type), _compatible(t.item_type))
    return t


def _read_parquet_file(spark: SparkSession, columns: list[str], path: str) -> DataFrame:
    """A Parquet export in the parse stage's layout: columns as text (nested values as JSON), rows
    numbered from 1 within the file, the row as JSON for the quarantine's raw bytes."""
    df, row_index, file_columns = _parquet_rows(spark, path)
    types = {c: t for c, t in df.dtypes if c in file_columns}

    def text(c: str) -> Column:
        if c not in types:
            return F.lit(None).cast("string")
        nested = types[c].startswith(("struct", "map", "array"))
        return F.to_json(F.col(c)) if nested else F.col(c).cast("string")

    return df.select(
        (row_index + 1).alias(SOURCE_OFFSET),
        F.lit(0).alias(SOURCE_PARTITION),
        F.to_json(F.struct(*[F.col(f"`{c}`") for c in file_columns])).cast("binary").alias(RAW),
        *[text(c).alias(c) for c in columns],
        F.struct(*[text(c).alias(c) for c in columns]).alias(INPUT),
        gather([]).alias(ERRORS),
    ).withColumn(ROW_ID, F.col(SOURCE_OFFSET))


def read_snapshot(spark: SparkSession, pipeline: Pipeline, files: list[str]) -> DataFrame:
    """Every file of the export, parsed; `_source_partition` is the file's index in `files`."""
    source = pipeline.config.source
    frames = []
    for i, path in enumerate(files):
        df = (
            _read_parquet_file(spark, list(source.columns), path)
            if path.endswith(".parquet")
            else read_lines_file(spark, source, path)
        )
        frames.append(
            df.select(
                (F.lit(i).cast("long") * (1 << FILE_SHIFT) + F.col(SOURCE_OFFSET)).alias(ROW_ID),
                F.lit(i).alias(SOURCE_PARTITION),
                SOURCE_OFFSET,
                RAW,
                *source.columns,
                INPUT,
                ERRORS,
            )
        )
    if not frames:
        raise ValueError("the snapshot export has no JSON lines or Parquet files")
    out = frames[0]
    for df in frames[1:]:
        out = out.unionByName(df)
    return out
