"""Records through a pipeline inside Spark tasks: a planned Kafka slice, or a landing file's lines.

For a Kafka slice with a vectorized plan (vector_plan.py) each task reads its offsets with confluent-kafka, runs the DuckDB
plan on the Arrow batch it holds and passes the result to `then` (which writes files and hands back what
the driver commits): raw records never leave the task and never become JVM rows. A landing file's tasks each
read a byte range of the file themselves (landing_source.span_lines) and pass their lines' result to `then`
the same way. A pipeline with a stage
that has no vectorized form runs its plan in Spark as before (the kafka_offsets source, from_json, column
expressions) and `then` gets the same columns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.ingest.errors import ERRORS, PARSE, RAW, ROW_ID, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import Pipeline, validated_kafka_frame
from engagement_platform.ingest.sources import KAFKA_PARTITION_SHIFT, PARSER, header_lines, read_file
from engagement_platform.ingest.sql_types import NoSqlForm
from engagement_platform.ingest.vector_plan import VectorPlan, compile_plan
from engagement_platform.settings import load_settings
from engagement_platform.spark.handoff import HANDOFF_SCHEMA, collect_handoff, handoff
from engagement_platform.spark.kafka_source import offset_slices, read_slice
from engagement_platform.spark.landing_source import LineSpan, document_elements, file_spans, open_file, span_lines
from engagement_platform.streams.kafka_files import for_executors
from engagement_platform.streams.planning import BatchPlan

TaskFunction = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
SPARK, VECTORIZED = "spark", "vectorized"
RAW_SCHEMA = pa.schema(
    [(ROW_ID, pa.int64()), (SOURCE_PARTITION, pa.int32()), (SOURCE_OFFSET, pa.int64()), (RAW, pa.binary())]
)


def record_path(pipeline: Pipeline, wanted: str = VECTORIZED) -> tuple[VectorPlan | None, str]:
    """(the vectorized plan or None, why the pipeline runs where it runs)."""
    if wanted == SPARK:
        return None, SPARK
    try:
        return compile_plan(pipeline), VECTORIZED
    except NoSqlForm as exc:
        return None, f"{SPARK} ({exc})"


def slice_rows(messages: list[pa.RecordBatch]) -> pa.Table:
    """Messages (kafka_partition, kafka_offset, value) as the plan's raw rows, each with its stable row id."""
    if not messages:
        return RAW_SCHEMA.empty_table()
    table = pa.Table.from_batches(messages)
    partition, offset = table["kafka_partition"], table["kafka_offset"]
    row_id = pc.add(pc.shift_left(pc.cast(partition, pa.int64()), KAFKA_PARTITION_SHIFT), offset)
    return pa.table([row_id, partition, offset, table["value"]], schema=RAW_SCHEMA)


def validated_tasks(
    spark: SparkSession,
    pipeline: Pipeline,
    bootstrap_servers: str,
    plan: BatchPlan,
    then: TaskFunction,
    schema: str,
    kafka_config: dict | None = None,
    wanted: str = VECTORIZED,
) -> tuple[DataFrame, str]:
    """(the frame of `then`'s output over the slice's validated records, the record path taken)."""
    vector, path = record_path(pipeline, wanted)
    if vector is None:
        frame = validated_kafka_frame(spark, pipeline.config, bootstrap_servers, plan, kafka_config, pipeline.transform)
        return frame.mapInArrow(then, schema), path
    slices = offset_slices([(r.partition, r.start, r.end) for r in plan.ranges])
    config = for_executors(load_settings().kafka_config if kafka_config is None else kafka_config)
    topic = plan.topic

    def run(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in ids:
            for i in batch.column(0).to_pylist():
                rows = slice_rows(list(read_slice(bootstrap_servers, config, topic, slices[i])))
                yield from then(iter(vector.run(rows).to_batches()))

    frame = spark.range(0, len(slices), 1, numPartitions=len(slices))
    return frame.mapInArrow(run, schema), path


def task_slots(spark: SparkSession) -> int:
    """The tasks Spark runs at once by default (the session's spark.default.parallelism; 2 when unset)."""
    return max(1, int(spark.conf.get("spark.default.parallelism", None) or 2))


ROWS = "rows"  # the handoff kind of validated rows sent back to the driver


def validate_kafka_slice(
    spark: SparkSession,
    config: PipelineConfig,
    bootstrap_servers: str,
    plan: BatchPlan,
    kafka_config: dict | None = None,
    transform: Callable[[DataFrame], DataFrame] | None = None,
    pipeline: Pipeline | None = None,
    finish: Callable[[pa.Table], pa.Table] | None = None,
) -> pa.Table:
    """One planned Kafka slice (the plan's topic and exact offset ranges) parsed and validated, back on the
    driver as one Arrow table with `_errors` per row. A stream with checks and columns of its own gives them
    in both forms: `pipeline` (the config's pipeline with the stream's validators) and `finish` (Arrow ->
    Arrow, run in the task after the plan) for the vectorized path, `transform` (parsed -> validated frame)
    for Spark. A stream with only `transform` runs on Spark."""
    pipeline = pipeline or Pipeline.from_config(config)
    vector = record_path(pipeline)[0] if transform is None or finish is not None else None
    if vector is None:
        return validated_kafka_frame(spark, config, bootstrap_servers, plan, kafka_config, transform).toArrow()
    done = finish or (lambda rows: rows)

    def hand_back(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = list(batches)
        if rows:
            yield from handoff(ROWS, done(pa.Table.from_batches(rows)))

    frame, _ = validated_tasks(spark, pipeline, bootstrap_servers, plan, hand_back, HANDOFF_SCHEMA, kafka_config)
    found = collect_handoff(frame)
    return found[ROWS] if ROWS in found else done(vector.schema.empty_table())


def validated_file_tasks(
    spark: SparkSession,
    pipeline: Pipeline,
    path: str,
    then: TaskFunction,
    schema: str,
    split_bytes: int | None = None,
    wanted: str = VECTORIZED,
) -> tuple[DataFrame, str]:
    """(the frame of `then`'s output over a landing file's validated records, the record path taken). With a
    vectorized plan each task reads a byte range of a CSV or JSON lines file (a whole JSON document: one task,
    a record per element), runs the plan on its records and passes the result to `then`; otherwise Spark
    parses (a stage with no vectorized form, or `wanted` == SPARK) and `then` gets the same columns."""
    source = pipeline.config.source
    vector, path_taken = record_path(pipeline, wanted)
    if vector is None:
        return pipeline.transform(read_file(spark, source, path, split_bytes)).mapInArrow(then, schema), path_taken
    storage = load_settings().storage_options if "://" in path else {}  # executors share no environment
    document = source.format == "json"
    spans = (
        [LineSpan(path, 0, 0, 0, 0)]  # a document is read whole, as one task
        if document
        else file_spans(path, storage, split_bytes, header_lines(source), task_slots(spark))
    )

    def run(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in ids:
            for i in batch.column(0).to_pylist():
                found = document_records(path, storage) if document else span_lines(spans[i], storage)
                if isinstance(found, bytes):  # a document that is not JSON: one rejected record, its whole text
                    yield from then(iter(broken_document(vector.schema, found).to_batches()))
                    continue
                offsets = found.column(0)
                partition = pa.repeat(pa.scalar(0, pa.int32()), len(offsets))
                rows = pa.Table.from_arrays([offsets, partition, offsets, found.column(1)], schema=RAW_SCHEMA)
                yield from then(iter(vector.run(rows).to_batches()))

    return spark.range(0, len(spans), 1, numPartitions=len(spans)).mapInArrow(run, schema), path_taken


def document_records(path: str, storage_options: dict) -> pa.RecordBatch | bytes:
    """A whole JSON document's elements as records (_source_offset: the element's index, _raw: its bytes), or
    the document's bytes when it is not JSON."""
    with open_file(path, storage_options) as f:
        data = f.read()
    elements, broken = document_elements(data)
    if broken:
        return data
    return pa.RecordBatch.from_arrays(
        [pa.array(range(len(elements)), pa.int64()), pa.array(elements, pa.binary())], names=[SOURCE_OFFSET, RAW]
    )


def broken_document(schema: pa.Schema, data: bytes) -> pa.Table:
    """The plan's result for a document that is not JSON: one record at offset 0, rejected with its text."""
    error = {
        "stage": PARSE,
        "plugin": PARSER,
        "column_name": None,
        "error_code": "malformed_record",
        "message": "document is not valid JSON",
        "value": data.decode("utf-8", "replace")[:200],
    }
    row = {name: None for name in schema.names} | {
        ROW_ID: 0, SOURCE_PARTITION: 0, SOURCE_OFFSET: 0, ERRORS: [error], RAW: data
    }  # fmt: skip
    return pa.Table.from_pylist([row], schema=schema)


def validate_lines_file(
    spark: SparkSession, pipeline: Pipeline, path: str, split_bytes: int | None = None, wanted: str = VECTORIZED
) -> tuple[pa.Table, str]:
    """(a landing file parsed and validated, back on the driver as one Arrow table; the record path): what a
    batch would write and quarantine, without writing (the streams' tasks write their files themselves)."""

    def hand_back(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = list(batches)
        if rows:
            yield from handoff(ROWS, pa.Table.from_batches(rows))

    frame, path_taken = validated_file_tasks(spark, pipeline, path, hand_back, HANDOFF_SCHEMA, split_bytes, wanted)
    return collect_handoff(frame).get(ROWS, pa.table({})), path_taken  # no records: a table without columns
