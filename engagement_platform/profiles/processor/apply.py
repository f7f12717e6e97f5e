"""Processor: merge a tenant's unprocessed staging changes into its raw table, exactly once.

plan     the tenant's next slice is a range of staging table versions (after its last merged one, up
         to the current one), stored in the checkpoint store before any work, like a Kafka slice:
         a re-run after a crash reads exactly the same staging files.
compute  one Spark task per tenant reads the slice's staging files and the tenant's raw files and
         builds the MERGE source (resolution.merge_sources_to_files -> tenant_merge.py: latest
         change per key by CDC sequence, field-level JSON resolution, identity-graph relabelling of
         every affected row). The progress figures come from the staging log's statistics.
commit   per tenant, the raw table's MERGE, then the progress row, each with the txn (app id per
         tenant, batch id), so a re-run skips what is already there, then the checkpoint state rows
         (commit_batch's sequence and rules, fenced the same way). The tenant lock (ZooKeeper,
         `profile_raw/<tenant>`) wraps a call from the outside (`with streams.batch.fenced(lease)`).

`process_tenants` handles many tenants with one Spark pass (one run per tenant is `process_tenant`):
their plans are stored in one checkpoint commit, the MERGEs (one table each) run in parallel threads,
and the progress rows and the checkpoint rows of all tenants go in one commit each, every row with its
own txn. The fixed cost per tenant is then its MERGE alone (about six Delta commits per tenant before).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, Transaction, write_deltalake
from pyspark.sql import SparkSession

from engagement_platform.lake.checkpoints import BATCH, CHECKPOINTS, COMPACT_EVERY, PLAN, CheckpointStore, _plans, _states
from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec
from engagement_platform.profiles import snapshots
from engagement_platform.profiles.processor.progress import unprocessed_tenants  # noqa: F401  (the sensor's question, re-exported)
from engagement_platform.profiles.processor.resolution import (
    ACTION, RELINK, STAGED_DDL, UPSERT, batch_stats, merge_sources_to_files, with_partition_values,
)
from engagement_platform.profiles.processor import tenant_merge
from engagement_platform.profiles.tables import (
    PROFILE_CDC_STAGING, PROFILE_PROGRESS, RAW_SCHEMA, RAW_Z_ORDER, raw_table_name, raw_table_spec, validate_tenant,
)
from engagement_platform.streams.batch import Outcomes, _failpoint, active_lease
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import BatchPlan

SOURCE_SCHEMA = RAW_SCHEMA.append(pa.field(ACTION, pa.string()))
HANDOFF_MAX_AGE = timedelta(hours=24)  # a handoff folder older than this was left by a crashed run
MERGE_THREADS = 2  # delta-rs MERGEs of different tenants' tables in parallel (it releases the GIL)


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
    batch_seconds: dict[str, float] = field(default_factory=dict)  # the whole process_tenants call's phases
    source: pa.Table | None = field(default=None, repr=False)  # the MERGE source while committing

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
    return plan_tenant_batches(lake, checkpoints, [tenant]).get(tenant)


def plan_tenant_batches(lake: DeltaLake, checkpoints: CheckpointStore, tenants: list[str]) -> dict[str, BatchPlan]:
    """plan_tenant_batch for many tenants at once: one read of the checkpoint rows, one listing per
    staging snapshot needed, and the new plans stored in one checkpoint commit (one txn per tenant's
    plan, so each plan is still stored exactly once)."""
    if not tenants:
        return {}
    streams = {t: processor_stream(t) for t in tenants}
    rows = _checkpoint_rows(checkpoints.lake, list(streams.values()))
    by_stream = _split_by(rows, "stream")
    plans: dict[str, BatchPlan] = {}
    new: dict[str, BatchPlan] = {}
    current = lake.table(PROFILE_CDC_STAGING.name).version() if lake.exists(PROFILE_CDC_STAGING.name) else -1
    listings: dict[int, dict[str, set[str]]] = {}
    for tenant, stream in streams.items():
        stream_rows = by_stream.get(stream, CHECKPOINTS.schema.empty_table())
        stream_plans = _plans(stream, stream_rows)
        latest = stream_plans[-1] if stream_plans else None
        if latest is not None and _states(stream_rows, latest.batch_id).get(BATCH) != "done":
            plans[tenant] = latest
            continue
        after = latest.ranges[0].end - 1 if latest else -1
        if not _files_added(lake, listings, tenant, after, current):
            continue
        new[tenant] = BatchPlan(stream, latest.batch_id + 1 if latest else 1, PROFILE_CDC_STAGING.name, (OffsetRange(0, after + 1, current + 1),))
    if new:
        _record_plans(checkpoints.lake, list(new.values()))
        plans.update(new)
    return {t: plans[t] for t in tenants if t in plans}


def _files_added(lake: DeltaLake, listings: dict[int, dict[str, set[str]]], tenant: str, after: int, up_to: int) -> list[str]:
    """snapshots.files_added, with each staging snapshot listed once for all tenants."""
    if up_to <= after:
        return []

    def listing(version: int) -> dict[str, set[str]]:
        if version not in listings:
            listings[version] = snapshots.files_by_tenant(lake, PROFILE_CDC_STAGING.name, version) if version >= 0 else {}
        return listings[version]

    return sorted(listing(up_to).get(tenant, set()) - listing(after).get(tenant, set()))


def _checkpoint_rows(lake: DeltaLake, streams: list[str]) -> pa.Table:
    if not lake.exists(CHECKPOINTS.name):
        return CHECKPOINTS.schema.empty_table()
    return lake.read(CHECKPOINTS.name, filters=[("stream", "in", streams)])


def _split_by(rows: pa.Table, column: str) -> dict[str, pa.Table]:
    """value -> its rows: runs of equal values are found without sorting when the rows arrive grouped;
    a table that is not grouped is sorted first."""
    if not rows.num_rows:
        return {}
    runs = pc.run_end_encode(rows[column].combine_chunks())
    values = runs.values.to_pylist()
    if len(set(values)) < len(values):
        return _split_by(rows.sort_by(column), column)
    out, start = {}, 0
    for value, end in zip(values, runs.run_ends.to_pylist()):
        out[value] = rows.slice(start, end - start)
        start = end
    return out


def _append_many(lake: DeltaLake, spec: TableSpec, rows: list[tuple[BatchTxn, dict]], metadata: dict | None = None) -> int | None:
    """Append rows of several batches in ONE commit carrying every batch's txn (rows whose txn the table
    already has are left out), so each row is still written exactly once. None when nothing was left."""
    table = lake.ensure(spec)
    todo = [(txn, row) for txn, row in rows if not _has_txn(table, txn)]
    if not todo:
        return None
    for _, row in todo:
        for name in spec.schema.names:
            row.setdefault(name, None)
    txns = list({(t.app_id, t.version): t for t, _ in todo}.values())
    props = CommitProperties(app_transactions=[Transaction(app_id=t.app_id, version=t.version) for t in txns],
                             custom_metadata={"batches": str(len(txns)), **{k: str(v) for k, v in (metadata or {}).items()}})
    write_deltalake(table, pa.Table.from_pylist([row for _, row in todo], schema=spec.schema), mode="append", schema_mode="merge",
                    partition_by=list(spec.partition_by) or None, target_file_size=spec.target_file_size, commit_properties=props)
    table.update_incremental()
    return table.version()


def _has_txn(table, txn: BatchTxn) -> bool:
    last = table.transaction_version(txn.app_id)
    return last is not None and last >= txn.version


def _record_plans(lake: DeltaLake, plans: list[BatchPlan]) -> None:
    """CheckpointStore.record_plan for many plans, in one commit (the same rows and txns)."""
    _append_many(lake, CHECKPOINTS, [
        (BatchTxn(f"{p.stream}/plan", p.batch_id), dict(stream=p.stream, batch_id=p.batch_id, process=PLAN, state="planned",
                                                        topic=p.topic, ranges=p.ranges_json(), recorded_at=datetime.now(timezone.utc)))
        for p in plans])


def _state_row(plan: BatchPlan, process: str, state: str, at: datetime, table_version: int | None = None, **detail) -> tuple[BatchTxn, dict]:
    """CheckpointStore.record_state's row and txn."""
    row = dict(stream=plan.stream, batch_id=plan.batch_id, process=process, state=state, topic=plan.topic, ranges=plan.ranges_json(),
               table_version=table_version, detail=json.dumps(detail, default=str), recorded_at=at)
    return BatchTxn(f"{plan.stream}/{process}/{state}", plan.batch_id), row


def process_tenant(spark: SparkSession, lake: DeltaLake, checkpoints: CheckpointStore, tenant: str) -> ProcessResult | None:
    """Merge everything staged for `tenant` since its last batch; None when there is nothing new."""
    return process_tenants(spark, lake, checkpoints, [tenant]).get(tenant)


def process_tenants(spark: SparkSession, lake: DeltaLake, checkpoints: CheckpointStore, tenants: list[str],
                    threads: int = MERGE_THREADS) -> dict[str, ProcessResult]:
    """One Spark pass for all `tenants`, then their commits: the raw MERGEs in `threads` parallel
    threads (one table each), then one progress commit and one checkpoint commit for all of them."""
    t0 = time.perf_counter()
    plans = plan_tenant_batches(lake, checkpoints, tenants)
    if not plans:
        return {}
    listings: dict[int, dict[str, set[str]]] = {}
    staged_by_tenant = {t: _files_added(lake, listings, t, p.ranges[0].start - 1, p.ranges[0].end - 1) for t, p in plans.items()}
    files = {t: (staged_by_tenant[t], snapshots.table_files(lake, raw_table_name(t))) for t in plans}
    # The progress row's figures come from the staging log's file statistics: no Spark job.
    stats = snapshots.staged_stats(lake, PROFILE_CDC_STAGING.name, staged_by_tenant)
    if stats is None:
        staged_uris = [u for uris in staged_by_tenant.values() for u in uris]
        stats = {r["tenant"]: r for r in batch_stats(with_partition_values(snapshots.read_files(spark, staged_uris, STAGED_DDL))).toArrow().to_pylist()}
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


def merge_sources(spark: SparkSession, lake: DeltaLake, files: dict[str, tuple[list[str], list[str]]]) -> dict[str, pa.Table]:
    """tenant -> its MERGE source, handed over by the Spark tasks in files under the lake's
    `_handoff/` folder, deleted once read. A crash can leave a folder behind (nothing reads it): each
    run first deletes the folders older than HANDOFF_MAX_AGE, far longer than any run holds one."""
    root = lake.root if "://" in lake.root else os.path.abspath(lake.root)
    parent, now = f"{root}/_handoff/profile_processor", datetime.now(timezone.utc)
    tenant_merge.sweep_handoffs(parent, now, HANDOFF_MAX_AGE)
    handoff = tenant_merge.new_handoff(parent, now, uuid.uuid4().hex)
    try:
        handed = merge_sources_to_files(spark, files, handoff).toArrow().to_pylist()
        return {row["tenant"]: tenant_merge.read_handoff(row["file"]) for row in handed}
    finally:
        try:
            tenant_merge.delete_handoff(handoff)
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


def commit_tenants(lake: DeltaLake, checkpoints: CheckpointStore, plans: dict[str, BatchPlan], sources: dict[str, pa.Table], stats: dict,
                   threads: int = MERGE_THREADS) -> dict[str, ProcessResult]:
    """The commit phase of many tenants, each exactly once per plan, in this order per tenant:
    its raw table's MERGE (txn: processor app id, batch id), its progress row (same txn), its
    checkpoint state rows. MERGEs of different tenants touch different tables, so they run in
    parallel; the progress rows of every tenant go in one commit carrying every tenant's txn, the
    checkpoint rows too. A crash anywhere leaves unfinished plans that a re-run resumes: each step
    is skipped where its txn is already in the table, as commit_batch does."""
    now = datetime.now(timezone.utc)
    lease = active_lease()
    results: dict[str, ProcessResult] = {}
    for tenant, plan in plans.items():
        rows = _merge_rows(sources.get(tenant, tenant_merge.SOURCE_SCHEMA.empty_table()), plan.batch_id, now)
        results[tenant] = _result(tenant, plan, rows, stats.get(tenant, {}))
        results[tenant].source = rows

    def fence(tenant: str) -> dict:
        if lease is None:
            return {}
        lease.check()  # raises LeaseLost: this writer must not commit
        return {"fencing_token": lease.token, "lock_name": lease.lock_name, "lock_owner": lease.owner}

    def merge(tenant: str) -> int | None:
        result, plan = results[tenant], plans[tenant]
        spec = raw_table_spec(tenant)
        t = time.perf_counter()
        txn = BatchTxn(processor_app_id(tenant), plan.batch_id, {"stream": plan.stream, "tenant": tenant, **fence(tenant)})
        table = lake.ensure(spec)
        version = None
        if not _has_txn(table, txn) and result.source.num_rows:
            result.merge_metrics = merge_raw(table, result.source, txn)
            version = table.version()
        result.versions[spec.name] = version
        result.seconds["commit_merge"] = time.perf_counter() - t
        _failpoint(plan.stream, spec.name)
        return version

    t = time.perf_counter()
    failed: dict[str, BaseException] = {}
    with ThreadPoolExecutor(max(1, threads)) as pool:
        futures = {tenant: pool.submit(merge, tenant) for tenant in plans}
        for tenant, future in futures.items():
            try:
                future.result()
            except Exception as exc:  # the other tenants still finish their batch
                failed[tenant] = exc
    merges_s = time.perf_counter() - t
    done = [t for t in plans if t not in failed]

    t = time.perf_counter()
    if done:
        meta = fence(done[0])
        progress_rows = []
        for tenant in done:
            result, plan = results[tenant], plans[tenant]
            progress_rows.append((BatchTxn(processor_app_id(tenant), plan.batch_id), _progress_row(result, stats.get(tenant, {}), now)))
        progress_table = lake.ensure(PROFILE_PROGRESS)
        there = {t for (txn, _), t in zip(progress_rows, done) if _has_txn(progress_table, txn)}
        version = _append_many(lake, PROFILE_PROGRESS, progress_rows, {"stream": "profile_processor", "tenants": len(done), **meta})
        for tenant in done:
            # None where this tenant's row was already there (a re-run), like commit_batch's outcome
            results[tenant].versions[PROFILE_PROGRESS.name] = None if tenant in there else version
            _failpoint(plans[tenant].stream, PROFILE_PROGRESS.name)
    progress_s = time.perf_counter() - t

    t = time.perf_counter()
    if done:
        state_rows = []
        for tenant in done:
            result, plan = results[tenant], plans[tenant]
            for name, version in result.versions.items():
                state_rows.append(_state_row(plan, name, "committed" if version is not None else "already_committed", now, version))
            state_rows.append(_state_row(plan, BATCH, "done", now, **{f"{k}_version": v for k, v in result.versions.items()}))
        _append_many(checkpoints.lake, CHECKPOINTS, state_rows, {"stream": "profile_processor", "tenants": len(done)})
        for tenant in done:
            if plans[tenant].batch_id % COMPACT_EVERY == 0:  # as CheckpointStore.mark_done
                checkpoints.lake.compact(CHECKPOINTS.name, partition_filters=[("stream", "=", plans[tenant].stream)])
    checkpoints_s = time.perf_counter() - t

    for tenant in plans:
        results[tenant].seconds.update(commit_merges=merges_s, commit_progress=progress_s, commit_checkpoints=checkpoints_s)
        results[tenant].source = None
    if failed:
        raise next(iter(failed.values()))
    return results


def _merge_rows(rows: pa.Table, batch_id: int, now: datetime) -> pa.Table:
    n = rows.num_rows
    rows = (rows.append_column("batch_id", pa.array([batch_id] * n, pa.int64()))
            .append_column("processed_at", pa.array([now] * n, pa.timestamp("us", tz="UTC"))))
    return rows.select(SOURCE_SCHEMA.names).cast(SOURCE_SCHEMA)


def _result(tenant: str, plan: BatchPlan, source: pa.Table, stats: dict) -> ProcessResult:
    upserts = pc.equal(source[ACTION], UPSERT)
    return ProcessResult(
        tenant, plan, changes_read=stats.get("changes_read", 0),
        rows_upserted=pc.sum(pc.and_(upserts, pc.invert(source["deleted"]))).as_py() or 0,
        rows_deleted=pc.sum(pc.and_(upserts, source["deleted"])).as_py() or 0,
        rows_relinked=pc.sum(pc.equal(source[ACTION], RELINK)).as_py() or 0,
        last_bucket=stats.get("last_bucket"), max_cdc_ts=stats.get("max_cdc_ts"),
    )


def _progress_row(result: ProcessResult, stats: dict, now: datetime) -> dict:
    after, up_to = result.staging_versions
    return dict(tenant=result.tenant, batch_id=result.plan.batch_id, staging_version_from=after, staging_version=up_to,
                last_bucket=result.last_bucket, max_cdc_ts=result.max_cdc_ts, max_cdc_seq=stats.get("max_cdc_seq"),
                changes_read=result.changes_read, rows_upserted=result.rows_upserted, rows_deleted=result.rows_deleted,
                rows_relinked=result.rows_relinked, raw_version=result.versions.get(raw_table_name(result.tenant)), processed_at=now)


def merge_raw(table, source: pa.Table, txn: BatchTxn) -> dict:
    """The raw table's MERGE. The guards repeat what the Spark plan decided, so a row changed since it
    was read never goes back in time."""
    return (
        table.merge(source, predicate="t.primary_id = s.primary_id", source_alias="s", target_alias="t",
                    commit_properties=txn.commit_properties())
        .when_matched_update_all(predicate=f"s.{ACTION} = '{UPSERT}' AND s.cdc_seq > t.cdc_seq", except_cols=[ACTION])
        .when_matched_update(updates={"related_ids": "s.related_ids", "component_id": "s.component_id"}, predicate=f"s.{ACTION} = '{RELINK}'")
        .when_not_matched_insert_all(predicate=f"s.{ACTION} = '{UPSERT}'", except_cols=[ACTION])
        .execute()
    )


def commit_tenant(lake: DeltaLake, checkpoints: CheckpointStore, tenant: str, plan: BatchPlan, rows: pa.Table, stats: dict) -> ProcessResult:
    """One tenant's commit phase (commit_tenants for one tenant)."""
    return commit_tenants(lake, checkpoints, {tenant: plan}, {tenant: rows}, {tenant: stats}, threads=1)[tenant]


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
