"""What one Spark task of a Kafka stream spends per record, phase by phase: the functions the task calls,
run here on one core over one slice of the benchmark's own topic. Read the offsets (confluent-kafka),
parse + convert + validate (the pipeline's vectorized plan, one DuckDB query), then the stream's step after it
(writing the data files, or the staging columns). Printed by the benchmarks as CPU-us per record."""

from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow as pa

from engagement_platform.ingest.pipeline import Pipeline
from engagement_platform.ingest.record_tasks import slice_rows
from engagement_platform.ingest.vector_plan import compile_plan
from engagement_platform.spark.kafka_source import OffsetSlice, read_slice


def kafka_task_phases(
    bootstrap_servers: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    pipeline: Pipeline,
    after: tuple[str, Callable[[pa.Table], object]] | None = None,
) -> dict[str, float]:
    """{phase: CPU-us per record} over offsets [start, end) of one partition ("records": how many)."""
    t = time.process_time()
    rows = slice_rows(list(read_slice(bootstrap_servers, {}, topic, OffsetSlice(partition, start, end))))
    read_s = time.process_time() - t
    n = max(rows.num_rows, 1)
    plan = compile_plan(pipeline)
    plan.run(rows.slice(0, 100))  # DuckDB's first query in this process
    t = time.process_time()
    result = plan.run(rows)
    phases = {"read": read_s, "parse_validate": time.process_time() - t}
    if after is not None:
        name, step = after
        t = time.process_time()
        step(result)
        phases[name] = time.process_time() - t
    return {"records": rows.num_rows, **{k: round(v / n * 1e6, 2) for k, v in phases.items()}}


def phases_line(phases: dict[str, float]) -> str:
    us = ", ".join(f"{k} {v:.2f}" for k, v in phases.items() if k != "records")
    return f"task CPU-us per record (one core, {phases['records']:,} records of one slice): {us}"
