"""A batch of landing files of one pipeline, through the shared batch lifecycle.

plan:    the sensor fixes the files waiting (a FileSetSlice: each file's path and size, up to the source's
         max_files_per_batch / max_bytes_per_batch) as batch N of stream `ingest.<pipeline>` in the checkpoint store.
compute: per file, Spark tasks parse -> convert -> validate its records (the vectorized plan, or Spark), write the
         target rows as Parquet files into the target's folder and hand back the files, the quarantine rows and
         counts (file_task.py). A pipeline with a `suppression:` section drops the records of erased subjects
         there (landing/suppressed.py).
commit:  the target's files, then the quarantine table (then the suppressed counts), each with the txn (app id,
         batch id); then done. A re-run of the same batch re-reads the same files, deletes what a dead attempt
         wrote and never committed, and skips the tables that already hold it (its tasks then write nothing).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.ingest.pipeline import Pipeline
from engagement_platform.ingest.record_tasks import validated_file_tasks
from engagement_platform.ingest.tables import quarantine_spec, target_spec
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.file_writes import WrittenFile, commit_files, delete_uncommitted, writer_tag
from engagement_platform.lake.quarantine import QUARANTINE_SCHEMA
from engagement_platform.lake.suppression_tables import (
    hits_table,
    load_suppressed,
    suppressed_rows,
    suppressed_step,
    suppression_of,
)
from engagement_platform.landing.file_task import COUNTS, QUARANTINE, SUPPRESSED, FileTask, written_files
from engagement_platform.landing.files import LandedFile, file_size, landed_files
from engagement_platform.settings import load_settings
from engagement_platform.spark.handoff import HANDOFF_SCHEMA, collect_handoff
from engagement_platform.streams.batch import CommitStep, commit_batch, failpoint
from engagement_platform.streams.planning import BatchPlan, FileSetSlice, FileSlice
from engagement_platform.streams.spec import BatchContext, StreamSpec

DATA_FILES = "data_files"  # the failpoint step after the tasks wrote the batch's target files


def stream_name(config: PipelineConfig) -> str:
    return f"ingest.{config.name}"


def app_id(config: PipelineConfig) -> str:
    return f"ingest.{config.name}"


def asset_name(config: PipelineConfig) -> str:
    """The pipeline's partitioned asset (landing/assets.py), whose runs commit its tables."""
    return f"ingest_{config.name}"


def landing_files(landing_root: str, config: PipelineConfig) -> list[LandedFile]:
    """Complete files matching the pipeline's glob, on a local folder or an object store (dot-files are
    in-flight uploads, skipped)."""
    return landed_files(landing_root, config.source.path or "", load_settings().storage_options)


def files_plan(config: PipelineConfig, batch_id: int, files: Sequence[tuple[str, int]]) -> BatchPlan:
    """Batch `batch_id` of the pipeline: the files (path, size), read in this order. One file is stored as a
    FileSlice, as before batches of files, so a plan of one file stays readable by an earlier version."""
    slices = tuple(FileSlice(str(path), size) for path, size in files)
    return BatchPlan(stream_name(config), batch_id, slices[0] if len(slices) == 1 else FileSetSlice(slices))


def file_plan(config: PipelineConfig, batch_id: int, path: str, size: int) -> BatchPlan:
    return files_plan(config, batch_id, [(path, size)])


def planned_files(plan: BatchPlan) -> tuple[FileSlice, ...]:
    """The files a landing plan holds (a plan stored with one FileSlice, before batches of files, too)."""
    return plan.slice_as(FileSetSlice).files


def landing_spec(config: PipelineConfig) -> StreamSpec:
    """The pipeline's landing stream: `run_batch` runs one stored plan (its files); it takes no lock."""

    def run_batch(ctx: BatchContext, plan: BatchPlan) -> LandingResult:
        return run_file_batch(ctx.spark, ctx.lake, ctx.checkpoints, config, plan)

    return StreamSpec(stream_name(config), app_id(config), run_batch)


@dataclass(frozen=True)
class FileCounts:
    path: str
    records_read: int
    records_rejected: int  # distinct records of the file in the quarantine

    @property
    def error_rate(self) -> float:
        return self.records_rejected / self.records_read if self.records_read else 0.0


@dataclass
class LandingResult:
    plan: BatchPlan
    records_read: int
    rows_written: int
    rows_rejected: int
    errors: int
    errors_by_code: dict[str, int]
    versions: dict[str, int | None]
    seconds: dict[str, float] = field(default_factory=dict)
    records_suppressed: int = 0  # naming an erased subject: dropped, stored nowhere
    files: list[FileCounts] = field(default_factory=list)
    record_path: str = ""  # where the records were parsed and validated (record_tasks.record_path)

    @property
    def error_rate(self) -> float:
        return self.rows_rejected / self.records_read if self.records_read else 0.0

    def metadata(self) -> dict:
        return {
            "batch_id": self.plan.batch_id,
            "files": len(self.files),
            "first_file": self.files[0].path if self.files else "-",
            "last_file": self.files[-1].path if self.files else "-",
            "records_read": self.records_read,
            "rows_written": self.rows_written,
            "rows_rejected": self.rows_rejected,
            "records_suppressed": self.records_suppressed,
            "record_path": self.record_path,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 6),
            **{f"errors_{k}": v for k, v in sorted(self.errors_by_code.items())},
            **{f"{k}_version": v for k, v in self.versions.items()},
            **{f"seconds_{k}": round(v, 3) for k, v in self.seconds.items()},
        }


@dataclass(frozen=True)
class FileOutcome:
    files: list[WrittenFile]  # written into the target's folder by the tasks, not committed yet
    quarantine: pa.Table
    hits: pa.Table  # (scope, hash) of each record naming an erased subject
    records_read: int
    rows_written: int
    record_path: str


def compute_file(spark: SparkSession, task: FileTask, split_bytes: int | None = None) -> FileOutcome:
    """One file through the pipeline in Spark tasks, which write its target rows (file_task.py)."""
    pipeline = Pipeline.from_config(task.config)
    frame, record_path = validated_file_tasks(
        spark, pipeline, task.source, task.function(), HANDOFF_SCHEMA, split_bytes
    )
    handed = collect_handoff(frame)
    counts = handed.get(COUNTS, pa.table({"read": pa.array([], pa.int64()), "written": pa.array([], pa.int64())}))
    return FileOutcome(
        written_files(handed),
        handed.get(QUARANTINE, QUARANTINE_SCHEMA.empty_table()),
        handed.get(SUPPRESSED, hits_table([])),
        sum(counts["read"].to_pylist()),
        sum(counts["written"].to_pylist()),
        record_path,
    )


def run_file_batch(
    spark: SparkSession, lake: DeltaLake, checkpoints: CheckpointStore, config: PipelineConfig, plan: BatchPlan
) -> LandingResult:
    files = planned_files(plan)
    storage = load_settings().storage_options
    for planned in files:  # all checked before anything is read: a batch reads every file or none
        size = file_size(planned.path, storage)
        if size != planned.size:
            raise RuntimeError(
                f"{planned.path} changed since it was planned ({planned.size} bytes then, {size} now): "
                "landing files must be complete when they appear (write elsewhere, then rename)"
            )
    target, quarantined = target_spec(config), quarantine_spec(config)
    # The target takes the config's new columns, or the batch is refused before anything is read or written.
    lake.ensure_config_schema(target)
    seconds = {}
    t0 = time.perf_counter()
    at = datetime.now(UTC)
    tag = writer_tag(app_id(config), plan.batch_id)
    write = not lake.already_committed(target.name, BatchTxn(app_id(config), plan.batch_id))
    if write:
        delete_uncommitted(lake, target, tag)  # what an earlier attempt's tasks wrote before it died
    tables = suppression_of(lake, config.suppression.list_table) if config.suppression else None
    # records naming an erased subject are dropped in the tasks, counted by hash (landing/suppressed.py)
    suppressed = load_suppressed(lake, tables[0], load_settings().erasure.secret) if tables else None
    outcomes = [
        compute_file(
            spark,
            FileTask(config, planned.path, plan.batch_id, at, lake.uri(target.name), tag, write, lake.storage_options,
                     suppressed),
        )
        for planned in files
    ]  # fmt: skip
    written = [f for o in outcomes for f in o.files]
    failpoint(stream_name(config), DATA_FILES)  # the tasks' files are written, nothing is committed
    quarantine = pa.concat_tables([o.quarantine for o in outcomes])
    hits = pa.concat_tables([o.hits for o in outcomes])
    read = sum(o.records_read for o in outcomes)
    rows_written = sum(o.rows_written for o in outcomes)
    steps = []
    if tables:
        steps.append(
            suppressed_step(lake, tables[1], suppressed_rows(tables[1], hits, stream_name(config), plan.batch_id, at))
        )
    seconds["compute"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    versions = commit_batch(
        plan,
        app_id(config),
        [
            CommitStep(target.name, lambda txn, _: commit_files(lake, target, written, txn)),
            CommitStep(quarantined.name, lambda txn, _: lake.append(quarantined, quarantine, txn)),
            *steps,
        ],
        checkpoints,
        files=len(files),
        first_file=files[0].path,
    )
    seconds["commit"] = time.perf_counter() - t1
    codes: dict[str, int] = {}
    for code in quarantine["error_code"].to_pylist():
        codes[code] = codes.get(code, 0) + 1
    return LandingResult(
        plan,
        read,
        rows_written,
        read - rows_written - hits.num_rows,
        quarantine.num_rows,
        codes,
        versions,
        seconds,
        records_suppressed=hits.num_rows,
        files=file_counts(files, [o.records_read for o in outcomes], quarantine),
        record_path=", ".join(sorted({o.record_path for o in outcomes})),
    )


def file_counts(files: Sequence[FileSlice], read: Sequence[int], quarantine: pa.Table) -> list[FileCounts]:
    """Per file: records read and distinct records quarantined (row ids are file:line, so distinct across files)."""
    rejected: dict[str, int] = {}
    if quarantine.num_rows:
        distinct = quarantine.select(["source", "row_id"]).group_by(["source", "row_id"]).aggregate([])
        for source, n in zip(*pc.value_counts(distinct["source"]).flatten()):
            rejected[source.as_py()] = n.as_py()
    return [FileCounts(f.path, n, rejected.get(f.path, 0)) for f, n in zip(files, read)]
