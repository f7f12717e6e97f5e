"""The processor's commit phase, through the shared lifecycle (streams.batch.commit_batches).

Per tenant, in this order: its raw table's MERGE, then its progress row, each with the txn (app id per
tenant, batch id), then the checkpoint states. The MERGEs of different tenants touch different tables,
so they run in parallel threads; the progress rows of every tenant go in one commit carrying every
tenant's txn, the checkpoint rows too. A crash anywhere leaves unfinished plans that a re-run resumes:
each step is skipped where its txn is already in the table. The fixed cost per tenant is its MERGE.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.profiles.processor import tenant_merge
from engagement_platform.profiles.processor.planning import processor_app_id, staging_slice
from engagement_platform.profiles.processor.resolution import ACTION, RELINK, UPSERT
from engagement_platform.profiles.tables import PROFILE_PROGRESS, RAW_SCHEMA, raw_table_name, raw_table_spec
from engagement_platform.streams.batch import AppendStep, Batch, CommitStep, Outcomes, commit_batches
from engagement_platform.streams.planning import BatchPlan

SOURCE_SCHEMA = RAW_SCHEMA.append(pa.field(ACTION, pa.string()))
MERGE_THREADS = 2  # delta-rs MERGEs of different tenants' tables in parallel (it releases the GIL)
PROCESSOR = "profile_processor"  # the family of the per-tenant streams, in shared commits' metadata


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

    @property
    def staging_versions(self) -> tuple[int, int]:
        """(after, up to]: the staging versions this batch merged."""
        versions = staging_slice(self.plan)
        return versions.after, versions.up_to

    def metadata(self) -> dict:
        return {
            "tenant": self.tenant,
            "batch_id": self.plan.batch_id,
            "staging_versions": list(self.staging_versions),
            "changes_read": self.changes_read,
            "rows_upserted": self.rows_upserted,
            "rows_deleted": self.rows_deleted,
            "rows_relinked": self.rows_relinked,
            "last_bucket": self.last_bucket or "",
            **{f"{k}_version": v for k, v in self.versions.items()},
            **{f"seconds_{k}": round(v, 3) for k, v in self.seconds.items()},
        }


def commit_tenants(
    lake: DeltaLake,
    checkpoints: CheckpointStore,
    plans: dict[str, BatchPlan],
    sources: dict[str, pa.Table],
    stats: dict,
    threads: int = MERGE_THREADS,
) -> dict[str, ProcessResult]:
    """The commit phase of many tenants, each exactly once per plan (see the module docstring). When a
    tenant's MERGE fails, the other tenants still finish their batch, then the first error is raised."""
    now = datetime.now(UTC)
    results: dict[str, ProcessResult] = {}
    batches = []
    for tenant, plan in plans.items():
        source = _merge_rows(sources.get(tenant, tenant_merge.SOURCE_SCHEMA.empty_table()), plan.batch_id, now)
        result = results[tenant] = _result(tenant, plan, source, stats.get(tenant, {}))
        progress = _progress_rows(result, stats.get(tenant, {}), now)
        batches.append(
            Batch(
                plan,
                processor_app_id(tenant),
                [
                    CommitStep(raw_table_name(tenant), _merge_step(lake, result, source), phase="merges"),
                    AppendStep(lake, PROFILE_PROGRESS, progress, phase="progress"),
                ],
                {"tenant": tenant},
                outcomes=result.versions,
            )
        )
    seconds = commit_batches(batches, checkpoints, threads, stream=PROCESSOR).seconds
    for result in results.values():
        result.seconds.update(
            commit_merges=seconds.get("merges", 0.0),
            commit_progress=seconds.get("progress", 0.0),
            commit_checkpoints=seconds["checkpoints"],
        )
    return results


def _merge_step(lake: DeltaLake, result: ProcessResult, source: pa.Table):
    def merge(txn: BatchTxn, _: Outcomes) -> int | None:
        t = time.perf_counter()
        table = lake.ensure(raw_table_spec(result.tenant))
        last = table.transaction_version(txn.app_id)
        version = None
        if (last is None or last < txn.version) and source.num_rows:
            result.merge_metrics = merge_raw(table, source, txn)
            version = table.version()
        result.seconds["commit_merge"] = time.perf_counter() - t
        return version

    return merge


def merge_raw(table, source: pa.Table, txn: BatchTxn) -> dict:
    """The raw table's MERGE. The guards repeat what the Spark plan decided, so a row changed since it
    was read never goes back in time."""
    return (
        table.merge(
            source,
            predicate="t.primary_id = s.primary_id",
            source_alias="s",
            target_alias="t",
            commit_properties=txn.commit_properties(),
        )
        .when_matched_update_all(predicate=f"s.{ACTION} = '{UPSERT}' AND s.cdc_seq > t.cdc_seq", except_cols=[ACTION])
        .when_matched_update(
            updates={"related_ids": "s.related_ids", "component_id": "s.component_id"},
            predicate=f"s.{ACTION} = '{RELINK}'",
        )
        .when_not_matched_insert_all(predicate=f"s.{ACTION} = '{UPSERT}'", except_cols=[ACTION])
        .execute()
    )


def _merge_rows(rows: pa.Table, batch_id: int, now: datetime) -> pa.Table:
    n = rows.num_rows
    rows = rows.append_column("batch_id", pa.repeat(pa.scalar(batch_id, pa.int64()), n)).append_column(
        "processed_at", pa.repeat(pa.scalar(now, pa.timestamp("us", tz="UTC")), n)
    )
    return rows.select(SOURCE_SCHEMA.names).cast(SOURCE_SCHEMA)


def _result(tenant: str, plan: BatchPlan, source: pa.Table, stats: dict) -> ProcessResult:
    upserts = pc.equal(source[ACTION], UPSERT)
    return ProcessResult(
        tenant,
        plan,
        changes_read=stats.get("changes_read", 0),
        rows_upserted=pc.sum(pc.and_(upserts, pc.invert(source["deleted"]))).as_py() or 0,
        rows_deleted=pc.sum(pc.and_(upserts, source["deleted"])).as_py() or 0,
        rows_relinked=pc.sum(pc.equal(source[ACTION], RELINK)).as_py() or 0,
        last_bucket=stats.get("last_bucket"),
        max_cdc_ts=stats.get("max_cdc_ts"),
    )


def _progress_rows(result: ProcessResult, stats: dict, now: datetime):
    """The progress step's rows: one per batch, with the raw table's version as the MERGE step left it."""
    after, up_to = result.staging_versions

    def rows(outcomes: Outcomes) -> list[dict]:
        return [
            dict(
                tenant=result.tenant,
                batch_id=result.plan.batch_id,
                staging_version_from=after,
                staging_version=up_to,
                last_bucket=result.last_bucket,
                max_cdc_ts=result.max_cdc_ts,
                max_cdc_seq=stats.get("max_cdc_seq"),
                changes_read=result.changes_read,
                rows_upserted=result.rows_upserted,
                rows_deleted=result.rows_deleted,
                rows_relinked=result.rows_relinked,
                raw_version=outcomes.get(raw_table_name(result.tenant)),
                processed_at=now,
            )
        ]

    return rows
