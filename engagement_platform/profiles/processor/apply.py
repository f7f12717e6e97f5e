"""Processor: merge a tenant's unprocessed staging changes into its raw table, exactly once.

plan     the tenant's next slice is a range of staging table versions (planning.py), stored in the
         checkpoint store before any work: a re-run after a crash reads exactly the same staging files.
compute  one Spark task per tenant reads the slice's staging files and the tenant's raw files and
         builds the MERGE source (resolution.merge_sources_to_files -> tenant_merge.py: latest
         change per key by CDC sequence, field-level JSON resolution, identity-graph relabelling of
         every affected row). The progress figures come from the staging log's statistics.
commit   per tenant, the raw table's MERGE, then the progress row, then the checkpoint states
         (commit.py, through streams.batch.commit_batches: txn, fencing and fault points as every
         stream). The tenant lock (ZooKeeper, `profile_raw/<tenant>`) wraps a call from the outside
         (profiles/locks.py: `with streams.batch.fenced(lease)`).

`process_tenants` handles many tenants with one Spark pass (a processor run of a range of tenants):
their plans are stored in one checkpoint commit, the MERGEs (one table each) run in parallel threads,
and the progress rows and the checkpoint rows of all tenants go in one commit each, every row with its
own txn.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from pyspark.sql import SparkSession

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.suppression_tables import load_suppressed
from engagement_platform.profiles import snapshots
from engagement_platform.profiles.processor.commit import MERGE_THREADS, ProcessResult, commit_tenants
from engagement_platform.profiles.processor.planning import (
    plan_tenant_batches,
    processor_app_id,
    processor_group_stream,
    processor_stream,
    staging_listings,
    staging_slice,
)
from engagement_platform.profiles.processor.progress import unprocessed_tenants
from engagement_platform.profiles.processor.resolution import (
    FILE_PATH,
    STAGED_DDL,
    batch_stats,
    merge_sources_to_files,
    with_partition_values,
)
from engagement_platform.profiles.snapshots import SnapshotListings
from engagement_platform.profiles.tables import (
    PROFILE_CDC_STAGING,
    PROFILE_ERASED_SUBJECTS,
    RAW_SCHEMA,
    RAW_Z_ORDER,
    raw_table_name,
)
from engagement_platform.settings import load_settings
from engagement_platform.spark import handoff_files
from engagement_platform.streams.planning import BatchPlan

__all__ = [
    "ProcessResult",
    "process_tenant",
    "process_tenants",
    "processor_app_id",
    "processor_group_stream",
    "processor_stream",
    "read_profiles",
    "run_tenant_batches",
    "unprocessed_tenants",
    "z_order_raw",
]  # unprocessed_tenants: the sensor's question

HANDOFF_MAX_AGE = timedelta(hours=24)  # a handoff folder older than this was left by a crashed run


def process_tenant(
    spark: SparkSession, lake: DeltaLake, checkpoints: CheckpointStore, tenant: str
) -> ProcessResult | None:
    """Merge everything staged for `tenant` since its last batch; None when there is nothing new."""
    return process_tenants(spark, lake, checkpoints, [tenant]).get(tenant)


def process_tenants(
    spark: SparkSession, lake: DeltaLake, checkpoints: CheckpointStore, tenants: list[str], threads: int = MERGE_THREADS
) -> dict[str, ProcessResult]:
    """Plan every tenant's batch (resuming unfinished ones), then run_tenant_batches."""
    started = time.perf_counter()
    listings = staging_listings(lake)
    plans = plan_tenant_batches(lake, checkpoints, tenants, listings)
    return run_tenant_batches(spark, lake, checkpoints, plans, threads, listings, started)


def run_tenant_batches(
    spark: SparkSession,
    lake: DeltaLake,
    checkpoints: CheckpointStore,
    plans: dict[str, BatchPlan],
    threads: int = MERGE_THREADS,
    listings: SnapshotListings | None = None,
    started: float | None = None,
) -> dict[str, ProcessResult]:
    """One Spark pass for the planned tenants, then their commits: the raw MERGEs in `threads` parallel
    threads (one table each), then one progress commit and one checkpoint commit for all of them."""
    if not plans:
        return {}
    t0 = started if started is not None else time.perf_counter()
    listings = listings or staging_listings(lake)
    slices = {t: staging_slice(p) for t, p in plans.items()}
    staged_by_tenant = {t: listings.added(t, v.after, v.up_to) for t, v in slices.items()}
    files = {t: (staged_by_tenant[t], snapshots.table_files(lake, raw_table_name(t))) for t in plans}
    # The progress row's figures come from the staging log's file statistics: no Spark job.
    stats = snapshots.staged_stats(lake, PROFILE_CDC_STAGING.name, staged_by_tenant)
    if stats is None:
        stats = staged_stats_from_rows(spark, lake, staged_by_tenant)
    t1 = time.perf_counter()
    sources = merge_sources(spark, lake, files)
    t2 = time.perf_counter()
    results = commit_tenants(lake, checkpoints, plans, sources, stats, threads)
    t3 = time.perf_counter()
    batch_seconds = {"plan": t1 - t0, "compute": t2 - t1, **_sum_commit_seconds(results.values()), "commit": t3 - t2}
    for result in results.values():
        result.seconds = {"plan": t1 - t0, "compute": t2 - t1, **result.seconds}
        result.batch_seconds = batch_seconds
    return results


def staged_stats_from_rows(
    spark: SparkSession, lake: DeltaLake, uris_by_tenant: dict[str, list[str]]
) -> dict[str, dict]:
    """snapshots.staged_stats' figures computed from the staged rows (a Spark job), for files whose log entry
    lacks a statistic: a staging writer other than the dumper."""
    staged_uris = [u for uris in uris_by_tenant.values() for u in uris]
    files = snapshots.read_files(spark, staged_uris, STAGED_DDL, lake.storage_options, path_column=FILE_PATH)
    return {r["tenant"]: r for r in batch_stats(with_partition_values(files)).toArrow().to_pylist()}


def merge_sources(
    spark: SparkSession, lake: DeltaLake, files: dict[str, tuple[list[str], list[str]]]
) -> dict[str, pa.Table]:
    """tenant -> its MERGE source, handed over by the Spark tasks in files under the lake's
    `_handoff/` folder, deleted once read. A crash can leave a folder behind (nothing reads it): each
    run first deletes the folders older than HANDOFF_MAX_AGE, far longer than any run holds one."""
    parent, now = handoff_files.handoff_parent(lake.root, "profile_processor"), datetime.now(UTC)
    handoff_files.sweep_handoffs(parent, now, HANDOFF_MAX_AGE, lake.storage_options)
    handoff = handoff_files.new_handoff(parent, now, uuid.uuid4().hex)
    try:
        suppressed = load_suppressed(lake, PROFILE_ERASED_SUBJECTS, load_settings().erasure.secret)
        handed = merge_sources_to_files(spark, files, handoff, lake.storage_options, suppressed).toArrow().to_pylist()
        return {row["tenant"]: handoff_files.read_handoff(row["file"], lake.storage_options) for row in handed}
    finally:
        try:
            handoff_files.delete_handoff(handoff, lake.storage_options)
        except FileNotFoundError:  # no task got as far as writing
            pass


def _sum_commit_seconds(results) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in results:
        for k, v in r.seconds.items():
            if k.startswith("commit_") and k != "commit_merge":
                out[k] = v  # shared steps: the same figure on every result
    out["commit_merge_sum"] = sum(r.seconds.get("commit_merge", 0.0) for r in results)
    return out


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
