"""Backfill: a hot-store snapshot export (JSON lines or Parquet files in a folder), up to a time
boundary, into one tenant's raw table, as a batch, exactly once.

Snapshot rows have the CDC record's columns without `op` (profile_snapshot_pipeline.yaml): each is
the *full state* of one profile, with the CDC sequence and timestamp of the last change it reflects.
How a row orders against CDC changes (json_merge's rule 1, by sequence, never by arrival):

- the stored row's sequence >= the snapshot row's: the stored row already holds that change or a
  newer one, so the snapshot row is dropped, exactly like a late CDC change;
- otherwise the snapshot row *replaces* the stored state (fields, links, record type): it is a full
  state at sequence S, so a stored key it lacks was removed by a delete and re-create it saw.
  Changes staged with sequence <= S are then dropped by the processor (rule 1); newer ones fold
  over the snapshot with the usual rules;
- rows with cdc_ts after `until` (the boundary) are left out and counted: CDC covers them;
- several rows of one id: the highest sequence wins (ties: later file, then later line).

Caveat: a profile the processor already stored from changes newer than its snapshot row keeps only
what those changes carried (the raw row keeps no per-key sequences). Backfill a tenant before its
processor merges changes past the boundary.

plan     stream `profile_backfill/<tenant>`, a SnapshotSlice: the export's path, the boundary and each file's
         name, size and modification time. An export any earlier batch of the tenant finished is a no-op,
         whatever ran since; a re-run of an unfinished batch re-reads exactly the same files (a changed
         file is an error); an export whose files changed since is a new batch.
compute  Spark parses and validates, keeps the newest valid row per id, and builds the MERGE source
         with the processor's own plan (resolution.merge_source) against the raw rows read at
         version V, the snapshot's keys marked replaced (tombstone-like: the fold starts empty).
commit   commit_batch: the raw MERGE (pinned to V, so a concurrent writer makes it fail instead of
         merging a stale plan; same clauses as the processor), then the quarantine; then done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from engagement_platform.ingest.config import load_pipeline
from engagement_platform.ingest.errors import ERRORS, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import Pipeline, QuarantineContext, quarantine_rows
from engagement_platform.ingest.plugins import ColumnValidator
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.suppression_tables import (
    drop_suppressed_quarantine,
    hits_table,
    load_suppressed,
    suppressed_rows,
    suppressed_step,
)
from engagement_platform.profiles import snapshots
from engagement_platform.profiles.backfill.export import plan_files, read_snapshot, snapshot_slice
from engagement_platform.profiles.processor.commit import SOURCE_SCHEMA, merge_raw  # the processor's MERGE and guards
from engagement_platform.profiles.processor.resolution import ACTION, KEY, RAW_DDL, RELINK, UPSERT, merge_source
from engagement_platform.profiles.records import PARSED_JSON, JsonShape, with_parsed_json, with_staging_columns
from engagement_platform.profiles.suppressed import SUPPRESSED_HASH, mark_suppressed
from engagement_platform.profiles.tables import (
    PROFILE_ERASED_SUBJECTS,
    PROFILE_SUPPRESSED_RECORDS,
    QUARANTINE_PROFILE_CDC,
    raw_table_spec,
    validate_tenant,
)
from engagement_platform.settings import load_settings
from engagement_platform.spark.local_input import local_input_read_by_tasks
from engagement_platform.streams.batch import CommitStep, Outcomes, commit_batch
from engagement_platform.streams.planning import BatchPlan, SnapshotSlice

PIPELINE_FILE = Path(__file__).with_name("pipeline.yaml")
QUARANTINE_PIPELINE = "profile_backfill"


def backfill_stream(tenant: str) -> str:
    return f"profile_backfill/{validate_tenant(tenant)}"


def backfill_app_id(tenant: str) -> str:
    return f"profile.backfill/{validate_tenant(tenant)}"


def _utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def parse_until(value: str | datetime) -> datetime:
    return _utc(value if isinstance(value, datetime) else datetime.fromisoformat(value.replace("Z", "+00:00")))


def plan_backfill(
    checkpoints: CheckpointStore, tenant: str, path: str | Path, until: datetime
) -> tuple[BatchPlan, bool]:
    """(plan, already done). An unfinished plan of the tenant is resumed (it must be the same export); an export
    that any earlier backfill of the tenant finished (same path, boundary, file names, sizes and modification
    times), whatever ran since, is already done; anything else is a new batch."""
    stream = backfill_stream(tenant)
    snapshot = snapshot_slice(path, until)
    batches = checkpoints.plans_and_done(stream)
    if batches and not batches[-1][1]:
        latest = batches[-1][0]
        if not latest.slice_as(SnapshotSlice).same_export(snapshot):
            raise RuntimeError(
                f"{stream}: batch {latest.batch_id} ({latest.slice.key}) is unfinished; re-run it before a new backfill"
            )
        return latest, False
    for plan, done in batches:
        if done and plan.slice_as(SnapshotSlice).same_export(snapshot):
            return plan, True
    plan = BatchPlan(stream, batches[-1][0].batch_id + 1 if batches else 1, snapshot)
    checkpoints.record_plan(plan)
    return plan, False


# ---- compute --------------------------------------------------------------------------------------


class SnapshotTenant(ColumnValidator):
    """A row that names a tenant must name the backfill's tenant."""

    class Params(BaseModel):
        tenant: str

    def errors(self) -> list[Column]:
        tenant = F.col("tenant")
        return [
            F.when(
                tenant.isNotNull() & (tenant != F.lit(self.params.tenant)),
                self.err(
                    "tenant",
                    "tenant_mismatch",
                    F.format_string(f"row of tenant %s in a backfill of {self.params.tenant}", tenant),
                    tenant,
                ),
            )
        ]


def snapshot_pipeline(tenant: str) -> Pipeline:
    config = load_pipeline(PIPELINE_FILE)
    pipeline = Pipeline.from_config(config)
    pipeline.validators += [
        JsonShape("profile_snapshot", JsonShape.Params(), config.target.columns),
        SnapshotTenant("profile_snapshot", SnapshotTenant.Params(tenant=tenant), config.target.columns),
    ]
    return pipeline


def snapshot_changes(valid: DataFrame, tenant: str) -> DataFrame:
    """Valid rows inside the boundary -> the processor's staged-change columns, newest row per id."""
    newest = Window.partitionBy("primary_id").orderBy(
        F.desc("cdc_seq"), F.desc(SOURCE_PARTITION), F.desc(SOURCE_OFFSET)
    )
    staged = with_staging_columns(valid).withColumn("_n", F.row_number().over(newest)).where("_n = 1")
    return staged.select(
        F.lit(tenant).alias("tenant"),
        "bucket",
        "primary_id",
        "related_ids",
        "record_type",
        F.lit(UPSERT).alias("op"),
        "cdc_seq",
        "cdc_ts",
        "fields",
    )


def replaced(raw: DataFrame, changes: DataFrame) -> DataFrame:
    """Raw rows with the snapshot's keys marked as tombstones without fields: the fold of a snapshot
    row then starts empty (a full state), while the stored sequence still drops stale rows and the
    stored links still find the components to relabel."""
    keys = changes.select(*KEY, F.lit(True).alias("_replaced"))
    hit = F.col("_replaced").isNotNull()
    return (
        raw.join(keys, KEY, "left")
        .withColumn("deleted", F.when(hit, F.lit(True)).otherwise(F.col("deleted")))
        .withColumn("fields", F.when(~hit, F.col("fields")))
        .drop("_replaced")
    )


# ---- the batch --------------------------------------------------------------------------------------


@dataclass
class BackfillResult:
    tenant: str
    plan: BatchPlan
    already_done: bool = False
    records_read: int = 0
    rows_valid: int = 0
    rows_beyond_boundary: int = 0
    records_quarantined: int = 0
    rows_upserted: int = 0
    rows_relinked: int = 0
    records_suppressed: int = 0  # naming an erased identity: dropped, stored nowhere
    raw_version_read: int | None = None
    versions: Outcomes = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def metadata(self) -> dict:
        snapshot = self.plan.slice_as(SnapshotSlice)
        return {
            "tenant": self.tenant,
            "batch_id": self.plan.batch_id,
            "path": snapshot.path,
            "until": snapshot.until.isoformat(),
            "files": len(snapshot.files),
            "already_done": self.already_done,
            "records_read": self.records_read,
            "rows_valid": self.rows_valid,
            "rows_beyond_boundary": self.rows_beyond_boundary,
            "records_quarantined": self.records_quarantined,
            "records_suppressed": self.records_suppressed,
            "rows_upserted": self.rows_upserted,
            "rows_relinked": self.rows_relinked,
            **{f"{k}_version": v for k, v in self.versions.items()},
            **{f"seconds_{k}": round(v, 3) for k, v in self.seconds.items()},
        }


def backfill_tenant(
    spark: SparkSession,
    lake: DeltaLake,
    checkpoints: CheckpointStore,
    tenant: str,
    path: str | Path,
    until: str | datetime,
    before_commit: Callable[[], None] | None = None,
) -> BackfillResult:
    """Load the export at `path` up to `until` into the tenant's raw table, exactly once.

    Take the tenant lock around the call (profiles/locks.py) so the processor does not write the
    table meanwhile. `before_commit` runs between compute and commit (tests hold a writer there)."""
    plan, done = plan_backfill(checkpoints, tenant, path, parse_until(until))
    if done:
        return BackfillResult(tenant, plan, already_done=True)
    return run_backfill_plan(spark, lake, checkpoints, tenant, plan, before_commit)


def run_backfill_plan(
    spark: SparkSession,
    lake: DeltaLake,
    checkpoints: CheckpointStore,
    tenant: str,
    plan: BatchPlan,
    before_commit: Callable[[], None] | None = None,
) -> BackfillResult:
    t0 = time.perf_counter()
    files = plan_files(plan)
    until = plan.slice_as(SnapshotSlice).until
    spec = raw_table_spec(tenant)
    read_version = lake.ensure(spec).version()
    pipeline = snapshot_pipeline(tenant)
    checked = pipeline.transform(with_parsed_json(read_snapshot(spark, pipeline, files)), keep=PARSED_JSON)
    ok = F.size(ERRORS) == 0
    inside = ok & (F.col("cdc_ts") <= F.lit(until))
    with local_input_read_by_tasks(spark, "the snapshot export", files):  # the first action that reads it
        counts = (
            checked.agg(
                F.count(F.lit(1)).alias("read"),
                F.count(F.when(ok, 1)).alias("valid"),
                F.count(F.when(ok & ~inside, 1)).alias("beyond"),
            )
            .toArrow()
            .to_pylist()[0]
        )
    bad = checked.where(~ok).withColumn("tenant", F.lit(tenant)).toArrow()
    changes = snapshot_changes(checked.where(inside), tenant)
    # rows naming an erased identity are dropped in the tasks and counted by hash (profiles/suppressed.py)
    suppressed = load_suppressed(lake, PROFILE_ERASED_SUBJECTS, load_settings().erasure.secret)
    hits = hits_table([])
    if suppressed.by_scope.get(tenant):
        marked = changes.mapInArrow(
            mark_suppressed(suppressed),
            StructType([*changes.schema.fields, StructField(SUPPRESSED_HASH, StringType())]),
        )
        named = (
            marked.where(F.col(SUPPRESSED_HASH).isNotNull())
            .select(SUPPRESSED_HASH)
            .toArrow()[SUPPRESSED_HASH]
            .to_pylist()
        )
        hits = hits_table([(tenant, h) for h in named])
        changes = marked.where(F.col(SUPPRESSED_HASH).isNull()).drop(SUPPRESSED_HASH)
    raw = snapshots.read_files(
        spark, lake.table(spec.name, version=read_version).file_uris(), RAW_DDL, lake.storage_options
    )
    source = merge_source(changes, replaced(raw, changes)).toArrow()
    at = datetime.now(UTC)
    errors, quarantine_hits = drop_suppressed_quarantine(_quarantine(bad, plan, files, at), suppressed)
    hits = pa.concat_tables([hits, hits_table(quarantine_hits)])
    t1 = time.perf_counter()

    result = BackfillResult(
        tenant,
        plan,
        records_read=counts["read"],
        rows_valid=counts["valid"],
        rows_beyond_boundary=counts["beyond"],
        records_quarantined=bad.num_rows - len(quarantine_hits),
        raw_version_read=read_version,
        records_suppressed=hits.num_rows,
    )
    source = _with_batch(source, plan.batch_id, at)
    result.rows_upserted = pc.sum(pc.equal(source[ACTION], UPSERT)).as_py() or 0
    result.rows_relinked = pc.sum(pc.equal(source[ACTION], RELINK)).as_py() or 0
    if before_commit is not None:
        before_commit()

    def merge_step(txn: BatchTxn, _: Outcomes) -> int | None:
        if lake.already_committed(spec.name, txn) or source.num_rows == 0:
            return None
        # Pinned to the version the plan was computed from: a commit by another writer since then
        # makes delta-rs refuse this one (CommitFailedError) rather than apply a stale plan.
        table = lake.table(spec.name, version=read_version)
        merge_raw(table, source, txn)
        return table.version()

    result.versions = commit_batch(
        plan,
        backfill_app_id(tenant),
        [
            CommitStep(spec.name, merge_step),
            CommitStep(QUARANTINE_PROFILE_CDC.name, lambda txn, _: lake.append(QUARANTINE_PROFILE_CDC, errors, txn)),
            suppressed_step(
                lake,
                PROFILE_SUPPRESSED_RECORDS,
                suppressed_rows(PROFILE_SUPPRESSED_RECORDS, hits, plan.stream, plan.batch_id, at),
            ),
        ],
        checkpoints,
        tenant=tenant,
    )
    result.seconds = {"compute": t1 - t0, "commit": time.perf_counter() - t1}
    return result


def _with_batch(source: pa.Table, batch_id: int, at: datetime) -> pa.Table:
    n = source.num_rows
    source = source.append_column("batch_id", pa.repeat(pa.scalar(batch_id, pa.int64()), n)).append_column(
        "processed_at", pa.repeat(pa.scalar(at, pa.timestamp("us", tz="UTC")), n)
    )
    return source.select(SOURCE_SCHEMA.names).cast(SOURCE_SCHEMA)


def _quarantine(bad: pa.Table, plan: BatchPlan, files: list[str], at: datetime) -> pa.Table:
    """One quarantine row per error, row_id `<file>:<line>` (Parquet: row number in the file)."""
    parts = []
    for i, path in enumerate(files):
        rows = bad.filter(pc.equal(bad[SOURCE_PARTITION], i))
        if rows.num_rows:
            parts.append(
                quarantine_rows(
                    rows, QuarantineContext(QUARANTINE_PIPELINE, plan.batch_id, path, at), org_column="tenant"
                )
            )
    return pa.concat_tables(parts) if parts else QUARANTINE_PROFILE_CDC.schema.empty_table()
