"""Processor: merge a tenant's unprocessed staging changes into its raw table, exactly once.

plan     the tenant's next slice is a range of staging table versions (after its last merged one, up
         to the current one), stored in the checkpoint store before any work, like a Kafka slice:
         a re-run after a crash reads exactly the same staging files.
compute  Spark reads the slice's staging files and the tenant's raw files and builds the MERGE
         source (resolution.py: latest change per key by CDC sequence, field-level JSON resolution,
         identity-graph relabelling of every affected row).
commit   commit_batch: the raw table's MERGE, then the progress row, each with the txn (app id per
         tenant, batch id), so a re-run skips what is already there. The tenant lock (ZooKeeper,
         `profile_raw/<tenant>`) wraps a call from the outside (`with streams.batch.fenced(lease)`).

`process_tenants` handles many tenants with one Spark pass (one run per tenant is `process_tenant`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.profiles import snapshots
from engagement_platform.profiles.progress import unprocessed_tenants  # noqa: F401  (the sensor's question, re-exported)
from engagement_platform.profiles.resolution import (
    ACTION, RAW_DDL, RELINK, STAGED_DDL, UPSERT, batch_stats, merge_source, with_partition_values,
)
from engagement_platform.profiles.tables import (
    PROFILE_CDC_STAGING, PROFILE_PROGRESS, RAW_SCHEMA, RAW_Z_ORDER, raw_table_name, raw_table_spec, validate_tenant,
)
from engagement_platform.streams.batch import CommitStep, Outcomes, commit_batch
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import BatchPlan

SOURCE_SCHEMA = RAW_SCHEMA.append(pa.field(ACTION, pa.string()))


def processor_stream(tenant: str) -> str:
    return f"profile_processor/{validate_tenant(tenant)}"


def processor_app_id(tenant: str) -> str:
    return f"profile.processor/{validate_tenant(tenant)}"


@dataclass
class ProcessResult:
    tenant: str
    plan: BatchPlan
    changes_read: int = 0
    rows_upserted: int = 0
    rows_deleted: int = 0
    rows_relinked: int = 0
    last_bucket: str | None = None
    max_cdc_ts: datetime | None = None
    versions: Outcomes = field(default_factory=dict)
    merge_metrics: dict = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def staging_versions(self) -> tuple[int, int]:
        """(after, up to]: the staging versions this batch merged."""
        r = self.plan.ranges[0]
        return r.start - 1, r.end - 1

    def metadata(self) -> dict:
        return {"tenant": self.tenant, "batch_id": self.plan.batch_id, "staging_versions": list(self.staging_versions),
                "changes_read": self.changes_read, "rows_upserted": self.rows_upserted, "rows_deleted": self.rows_deleted,
                "rows_relinked": self.rows_relinked, "last_bucket": self.last_bucket or "",
                **{f"{k}_version": v for k, v in self.versions.items()}, **{f"seconds_{k}": round(v, 3) for k, v in self.seconds.items()}}


def plan_tenant_batch(lake: DeltaLake, checkpoints: CheckpointStore, tenant: str) -> BatchPlan | None:
    """The tenant's unfinished plan if there is one (a crashed run resumes it), else a new slice of
    staging versions; None when nothing was staged for the tenant since its last batch."""
    stream = processor_stream(tenant)
    latest, done = checkpoints.latest(stream)
    if latest is not None and not done:
        return latest
    after = latest.ranges[0].end - 1 if latest else -1
    current = lake.table(PROFILE_CDC_STAGING.name).version() if lake.exists(PROFILE_CDC_STAGING.name) else -1
    if not snapshots.files_added(lake, PROFILE_CDC_STAGING.name, tenant, after, current):
        return None
    plan = BatchPlan(stream, latest.batch_id + 1 if latest else 1, PROFILE_CDC_STAGING.name, (OffsetRange(0, after + 1, current + 1),))
    checkpoints.record_plan(plan)
    return plan


def process_tenant(spark: SparkSession, lake: DeltaLake, checkpoints: CheckpointStore, tenant: str) -> ProcessResult | None:
    """Merge everything staged for `tenant` since its last batch; None when there is nothing new."""
    return process_tenants(spark, lake, checkpoints, [tenant]).get(tenant)


def process_tenants(spark: SparkSession, lake: DeltaLake, checkpoints: CheckpointStore, tenants: list[str]) -> dict[str, ProcessResult]:
    """One Spark pass for all `tenants`, then one exactly-once commit sequence per tenant."""
    t0 = time.perf_counter()
    plans = {t: p for t in tenants if (p := plan_tenant_batch(lake, checkpoints, t)) is not None}
    if not plans:
        return {}
    staged_uris = [u for t, p in plans.items() for u in snapshots.files_added(lake, PROFILE_CDC_STAGING.name, t, p.ranges[0].start - 1, p.ranges[0].end - 1)]
    raw_uris = [u for t in plans for u in snapshots.table_files(lake, raw_table_name(t))]
    staged = with_partition_values(snapshots.read_files(spark, staged_uris, STAGED_DDL))
    raw = snapshots.read_files(spark, raw_uris, RAW_DDL)
    t1 = time.perf_counter()
    stats = {r["tenant"]: r for r in batch_stats(staged).toArrow().to_pylist()}
    source = merge_source(staged, raw).toArrow()
    t2 = time.perf_counter()
    results = {}
    for tenant, plan in plans.items():
        rows = source.filter(pc.equal(source["tenant"], tenant))
        result = commit_tenant(lake, checkpoints, tenant, plan, rows, stats.get(tenant, {}))
        result.seconds = {"plan": t1 - t0, "compute": t2 - t1, **result.seconds}
        results[tenant] = result
    return results


def commit_tenant(lake: DeltaLake, checkpoints: CheckpointStore, tenant: str, plan: BatchPlan, rows: pa.Table, stats: dict) -> ProcessResult:
    """The raw table's MERGE, then the progress row, through commit_batch (exactly once per plan)."""
    now = datetime.now(timezone.utc)
    n = rows.num_rows
    rows = (rows.append_column("batch_id", pa.array([plan.batch_id] * n, pa.int64()))
            .append_column("processed_at", pa.array([now] * n, pa.timestamp("us", tz="UTC"))))
    source = rows.select(SOURCE_SCHEMA.names).cast(SOURCE_SCHEMA)
    upserts = pc.equal(source[ACTION], UPSERT)
    result = ProcessResult(
        tenant, plan, changes_read=stats.get("changes_read", 0),
        rows_upserted=pc.sum(pc.and_(upserts, pc.invert(source["deleted"]))).as_py() or 0,
        rows_deleted=pc.sum(pc.and_(upserts, source["deleted"])).as_py() or 0,
        rows_relinked=pc.sum(pc.equal(source[ACTION], RELINK)).as_py() or 0,
        last_bucket=stats.get("last_bucket"), max_cdc_ts=stats.get("max_cdc_ts"),
    )
    spec = raw_table_spec(tenant)

    def merge_step(txn: BatchTxn, _: Outcomes) -> int | None:
        lake.ensure(spec)
        if lake.already_committed(spec.name, txn) or source.num_rows == 0:
            return None
        # The guards repeat what the Spark plan decided, so a row changed since it was read never goes back in time.
        result.merge_metrics = (
            lake.merge(spec, source, "t.primary_id = s.primary_id", txn)
            .when_matched_update_all(predicate=f"s.{ACTION} = '{UPSERT}' AND s.cdc_seq > t.cdc_seq", except_cols=[ACTION])
            .when_matched_update(updates={"related_ids": "s.related_ids", "component_id": "s.component_id"}, predicate=f"s.{ACTION} = '{RELINK}'")
            .when_not_matched_insert_all(predicate=f"s.{ACTION} = '{UPSERT}'", except_cols=[ACTION])
            .execute()
        )
        return lake.table(spec.name).version()

    def progress_step(txn: BatchTxn, done: Outcomes) -> int | None:
        after, up_to = result.staging_versions
        row = dict(tenant=tenant, batch_id=plan.batch_id, staging_version_from=after, staging_version=up_to,
                   last_bucket=result.last_bucket, max_cdc_ts=result.max_cdc_ts, max_cdc_seq=stats.get("max_cdc_seq"),
                   changes_read=result.changes_read, rows_upserted=result.rows_upserted, rows_deleted=result.rows_deleted,
                   rows_relinked=result.rows_relinked, raw_version=done.get(spec.name), processed_at=now)
        return lake.append(PROFILE_PROGRESS, pa.Table.from_pylist([row], schema=PROFILE_PROGRESS.schema), txn)

    t = time.perf_counter()
    result.versions = commit_batch(plan, processor_app_id(tenant), [CommitStep(spec.name, merge_step), CommitStep(PROFILE_PROGRESS.name, progress_step)],
                                   checkpoints, tenant=tenant)
    result.seconds["commit"] = time.perf_counter() - t
    return result


def z_order_raw(lake: DeltaLake, tenant: str, target_size: int | None = None) -> dict:
    """Z-order the tenant's raw table by primary id and CDC timestamp (run under the tenant lock:
    it conflicts with a concurrent MERGE)."""
    return lake.z_order(raw_table_name(tenant), list(RAW_Z_ORDER), target_size=target_size)


def read_profiles(lake: DeltaLake, tenant: str, include_deleted: bool = False) -> pa.Table:
    """The tenant's current profiles (tombstones left out unless asked for)."""
    name = raw_table_name(tenant)
    if not lake.exists(name):
        return RAW_SCHEMA.empty_table()
    return lake.read(name, filters=None if include_deleted else [("deleted", "=", False)])
