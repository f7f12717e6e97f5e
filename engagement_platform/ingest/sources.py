"""Parse stage: a source (landing file or Kafka slice) -> input columns + parse errors.

Text formats (and each element of a JSON document) use Spark's PERMISSIVE mode with a corrupt-record column: a line that does not parse
keeps going as a row whose `_errors` says why, with its raw bytes. Every row carries a stable
`_row_id` derived from its source position (file line, or Kafka partition and offset), so a re-run
of the same batch produces the same ids.
"""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from engagement_platform.ingest.config import SourceSpec
from engagement_platform.ingest.errors import ERRORS, PARSE, RAW, ROW_ID, SOURCE_OFFSET, SOURCE_PARTITION, error, gather
from engagement_platform.settings import load_settings
from engagement_platform.spark import landing_source
from engagement_platform.streams.kafka import KafkaClient, OffsetRange
from engagement_platform.streams.kafka_files import for_executors

INPUT = "_input"  # struct of the parsed input columns: what the quarantine shows next to the raw record
CORRUPT = "_corrupt_record"
PARSER = "parser"
KAFKA_PARTITION_SHIFT = 40  # row id = partition << 40 | offset (offsets stay far below 2**40)


def _truthy(value: object) -> bool:
    return str(value).lower() in ("true", "1", "yes")


def read_schema(source: SourceSpec) -> str:
    return ", ".join(f"`{name}` {type_}" for name, type_ in source.columns.items()) + f", `{CORRUPT}` string"


def text_options(source: SourceSpec) -> dict[str, str]:
    opts = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in source.options.items() if k != "header"}
    return {**opts, "mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}


def parse_text(rows: DataFrame, source: SourceSpec, keep: tuple[str, ...] = ()) -> DataFrame:
    """rows: _row_id, _source_partition, _source_offset, _raw (binary) -> parsed input frame (plus `keep`)."""
    size = F.length(RAW)
    text = F.when(size <= source.max_record_bytes, F.col(RAW).cast("string"))
    staged = rows.select(ROW_ID, SOURCE_PARTITION, SOURCE_OFFSET, RAW, *keep, size.alias("_size"), text.alias("_text"))
    schema, opts = read_schema(source), text_options(source)
    parse = (
        F.from_csv(F.col("_text"), schema, opts)
        if source.format == "csv"
        else F.from_json(F.col("_text"), schema, opts)
    )
    parsed = staged.select("*", parse.alias("_parsed"))
    return parsed.select(
        ROW_ID,
        SOURCE_PARTITION,
        SOURCE_OFFSET,
        RAW,
        *keep,
        *[F.col(f"_parsed.`{c}`").alias(c) for c in source.columns],
        F.struct(*[F.col(f"_parsed.`{c}`").alias(c) for c in source.columns]).alias(INPUT),
        gather(parse_errors(source, F.col(RAW), F.col("_size"), F.col("_text"), F.col(f"_parsed.{CORRUPT}"))).alias(
            ERRORS
        ),
    )


def expected_record(source: SourceSpec) -> str:
    """What a record of this source must be: the malformed_record message says it."""
    if source.format == "csv":
        return f"a CSV line with {len(source.columns)} fields"
    return "one JSON object"


def parse_errors(source: SourceSpec, raw: Column, size: Column, text: Column, corrupt: Column) -> list[Column]:
    expected = expected_record(source)
    limit = source.max_record_bytes
    return [
        F.when(raw.isNull() | (size == 0), error(PARSE, PARSER, None, "empty_record", "record has no content")),
        F.when(
            size > limit,
            error(PARSE, PARSER, None, "oversized", F.format_string(f"record is %d bytes, limit {limit}", size)),
        ),
        F.when(
            corrupt.isNotNull(),
            error(PARSE, PARSER, None, "malformed_record", f"record is not {expected}", F.substring(text, 1, 200)),
        ),
    ]


def read_lines_file(spark: SparkSession, source: SourceSpec, path: str, split_bytes: int | None = None) -> DataFrame:
    """CSV or JSON lines: one record per line, numbered from 1 (the header line counts)."""
    return parse_text(raw_lines(spark, source, path, split_bytes), source)


def header_lines(source: SourceSpec) -> int:
    """How many lines at the top of a lines file are not records."""
    return 1 if source.format == "csv" and _truthy(source.options.get("header", False)) else 0


def raw_lines(spark: SparkSession, source: SourceSpec, path: str, split_bytes: int | None = None) -> DataFrame:
    """A lines file's records unparsed: _row_id, _source_partition, _source_offset (the line number), _raw."""
    opts = landing_source.options(path, header_lines(source), split_bytes, load_settings().storage_options)
    lines = spark.read.format("landing_lines").options(**opts).load()
    return lines.select(F.col(SOURCE_OFFSET).alias(ROW_ID), F.lit(0).alias(SOURCE_PARTITION), SOURCE_OFFSET, RAW)


def read_json_document(spark: SparkSession, source: SourceSpec, path: str) -> DataFrame:
    """A whole-file JSON document (an object or an array of objects), read in a Spark task through the
    lake's file system (`landing_document`); offsets are element indexes, each element's JSON stands for
    its raw bytes, and a document that does not parse is one record with its whole text."""
    opts = landing_source.options(path, storage_options=load_settings().storage_options)
    elements = spark.read.format("landing_document").options(**opts).load()
    rows = elements.select(
        F.col(SOURCE_OFFSET).alias(ROW_ID), F.lit(0).alias(SOURCE_PARTITION), SOURCE_OFFSET, RAW, "_document_error"
    )
    parsed = parse_text(rows, source, keep=("_document_error",))
    broken = error(
        PARSE,
        PARSER,
        None,
        "malformed_record",
        "document is not valid JSON",
        F.substring(F.col(RAW).cast("string"), 1, 200),
    )
    return parsed.withColumn(ERRORS, F.when(F.col("_document_error"), F.array(broken)).otherwise(F.col(ERRORS))).drop(
        "_document_error"
    )


def read_file(spark: SparkSession, source: SourceSpec, path: str, split_bytes: int | None = None) -> DataFrame:
    if source.format in ("csv", "jsonl"):
        return read_lines_file(spark, source, path, split_bytes)
    if source.format == "json":
        return read_json_document(spark, source, path)
    raise ValueError(f"{source.format} is not a file format")


def read_kafka(
    spark: SparkSession,
    source: SourceSpec,
    bootstrap_servers: str,
    topic: str,
    ranges_json: str,
    kafka_config: dict | None = None,
) -> DataFrame:
    """Exact Kafka offset ranges (the kafka_offsets data source), message values parsed as JSON."""
    messages = (
        spark.read.format("kafka_offsets")
        .option("bootstrap_servers", bootstrap_servers)
        .option("topic", topic)
        .option("ranges", ranges_json)
        # The driver's settings travel with the plan: executors share neither its environment nor its files.
        .option(
            "kafka_config",
            json.dumps(for_executors(load_settings().kafka_config if kafka_config is None else kafka_config)),
        )
        .load()
    )
    row_id = F.shiftleft(F.col("kafka_partition").cast("long"), KAFKA_PARTITION_SHIFT) + F.col("kafka_offset")
    rows = messages.select(
        row_id.alias(ROW_ID),
        F.col("kafka_partition").alias(SOURCE_PARTITION),
        F.col("kafka_offset").alias(SOURCE_OFFSET),
        F.col("value").alias(RAW),
    )
    return parse_text(rows, source)


def fetch_values(
    kafka: KafkaClient, topic: str, positions: set[tuple[int, int]]
) -> dict[tuple[int, int], bytes | None]:
    """Raw message values at exact (partition, offset) positions (one range read per partition): Spark returns
    raw bytes only for the rows it rejected, so rows rejected on the driver get theirs back from Kafka."""
    spans: dict[int, list[int]] = {}
    for p, o in positions:
        spans.setdefault(p, []).append(o)
    ranges = [OffsetRange(p, min(offsets), max(offsets) + 1) for p, offsets in spans.items()]
    return {
        (m.partition, m.offset): m.value
        for m in kafka.read_range(topic, ranges)
        if (m.partition, m.offset) in positions
    }
