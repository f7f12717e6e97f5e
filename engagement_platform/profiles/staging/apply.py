"""CDC dumper: one planned slice of topic `profile.cdc` -> profile_cdc_staging + quarantine.

compute: Spark tasks read the exact offsets and run the ingest framework's vectorized plan (pipeline.yaml +
         profiles/records.JsonShape) and the staging columns (records.with_staging_columns_arrow) as DuckDB
         queries; one Arrow result comes back.
         Changes naming an erased identity (the suppression list, profiles/suppressed.py) are dropped
         and counted by hash.
commit:  staging, then quarantine, then the suppressed counts, each an append carrying the txn (app id,
         batch id); then the checkpoint says done. A re-run of the same plan skips tables that already hold the batch.

Staging is append-only, so dumpers of different streams (e.g. one per group of topic partitions)
commit concurrently without conflicts; each stream's batches stay exactly-once through its own txn.
Each staging commit also names its tenants in its commit metadata, which is how the processor's
sensor finds tenants with new changes from the log alone (progress.unprocessed_tenants).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from engagement_platform.ingest.errors import ERRORS, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import QuarantineContext, quarantine_rows
from engagement_platform.ingest.record_tasks import VECTORIZED, record_path, validate_kafka_slice
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.suppression_tables import (
    drop_suppressed_quarantine,
    hits_table,
    load_suppressed,
    suppressed_rows,
    suppressed_step,
)
from engagement_platform.profiles.records import (
    profile_cdc_pipeline,
    profile_pipeline,
    validated_cdc,
    with_staging_columns_arrow,
)
from engagement_platform.profiles.suppressed import drop_suppressed_changes
from engagement_platform.profiles.tables import (
    PROFILE_CDC_STAGING,
    PROFILE_ERASED_SUBJECTS,
    PROFILE_SUPPRESSED_RECORDS,
    QUARANTINE_PROFILE_CDC,
)
from engagement_platform.settings import load_settings
from engagement_platform.streams.batch import CommitStep, Outcomes, commit_batch
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.spec import BatchContext, StreamSpec, batch_metadata

STREAM = "profile_cdc"
TENANTS_KEY = "tenants"  # staging commit metadata: comma-separated tenants of the commit


def app_id(stream: str) -> str:
    return f"profile.cdc_dumper/{stream}"


@dataclass
class StageResult:
    plan: BatchPlan
    records_read: int
    rows_staged: int
    records_quarantined: int
    errors: int
    versions: Outcomes
    tenants: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    records_suppressed: int = 0  # naming an erased identity: dropped, stored nowhere
    record_path: str = ""  # where the records were parsed and validated (record_tasks.record_path)

    def metadata(self) -> dict:
        return batch_metadata(
            self.plan,
            self.versions,
            self.seconds,
            records_read=self.records_read,
            rows_staged=self.rows_staged,
            records_quarantined=self.records_quarantined,
            records_suppressed=self.records_suppressed,
            tenants=len(self.tenants),
            record_path=self.record_path,
        )


def validate_cdc_slice(
    spark: SparkSession,
    bootstrap_servers: str,
    plan: BatchPlan,
    max_record_bytes: int | None = None,
    kafka_config: dict | None = None,
    wanted: str = VECTORIZED,
) -> tuple[pa.Table, str]:
    """(the slice parsed and validated, with the staging columns, `_errors` saying what is wrong; the record
    path taken): the vectorized plan and staging query in the tasks, or `wanted` == SPARK, Spark's."""
    config = profile_cdc_pipeline(plan.topic, max_record_bytes)
    pipeline = profile_pipeline(config)
    path = record_path(pipeline, wanted)[1]
    vectorized = {"pipeline": pipeline, "finish": with_staging_columns_arrow} if path == VECTORIZED else {}
    spark_form = partial(validated_cdc, config)
    return validate_kafka_slice(spark, config, bootstrap_servers, plan, kafka_config, spark_form, **vectorized), path


def split_staged(validated: pa.Table, plan: BatchPlan, staged_at: datetime) -> tuple[pa.Table, pa.Table]:
    """(staging rows, one quarantine row per error of each bad record)."""
    n_errors = pc.list_value_length(validated[ERRORS])
    good = validated.filter(pc.equal(n_errors, 0))
    n = good.num_rows
    good = (
        good.rename_columns({SOURCE_PARTITION: "source_partition", SOURCE_OFFSET: "source_offset"})
        .append_column("batch_id", pa.repeat(pa.scalar(plan.batch_id, pa.int64()), n))
        .append_column("staged_at", pa.repeat(pa.scalar(staged_at, pa.timestamp("us", tz="UTC")), n))
    )
    good = good.select(PROFILE_CDC_STAGING.schema.names).cast(PROFILE_CDC_STAGING.schema)
    context = QuarantineContext(STREAM, plan.batch_id, plan.topic, staged_at, kafka=True)
    return good, quarantine_rows(validated.filter(pc.greater(n_errors, 0)), context, org_column="tenant")


def stage_cdc_batch(
    spark: SparkSession,
    lake: DeltaLake,
    checkpoints: CheckpointStore,
    bootstrap_servers: str,
    plan: BatchPlan,
    max_record_bytes: int | None = None,
    kafka_config: dict | None = None,
) -> StageResult:
    """Stage one planned slice exactly once (a re-run of the same plan commits nothing twice)."""
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    validated, path = validate_cdc_slice(spark, bootstrap_servers, plan, max_record_bytes, kafka_config)
    seconds["read_validate"] = time.perf_counter() - t0
    staged_at = datetime.now(UTC)
    good, errors = split_staged(validated, plan, staged_at)
    # changes (and bad records) naming an erased identity are dropped, counted by hash only
    suppressed = load_suppressed(lake, PROFILE_ERASED_SUBJECTS, load_settings().erasure.secret)
    good, staged_hits = drop_suppressed_changes(good, suppressed)
    errors, quarantine_hits = drop_suppressed_quarantine(errors, suppressed)
    hits = hits_table(staged_hits + quarantine_hits)
    tenants = sorted(pc.unique(good["tenant"]).to_pylist())

    def stage(txn: BatchTxn, _: Outcomes) -> int | None:
        named = BatchTxn(txn.app_id, txn.version, {**txn.metadata, TENANTS_KEY: ",".join(tenants)})
        return lake.append(PROFILE_CDC_STAGING, good, named)

    t1 = time.perf_counter()
    versions = commit_batch(
        plan,
        app_id(plan.stream),
        [
            CommitStep(PROFILE_CDC_STAGING.name, stage),
            CommitStep(QUARANTINE_PROFILE_CDC.name, lambda txn, _: lake.append(QUARANTINE_PROFILE_CDC, errors, txn)),
            suppressed_step(
                lake,
                PROFILE_SUPPRESSED_RECORDS,
                suppressed_rows(PROFILE_SUPPRESSED_RECORDS, hits, STREAM, plan.batch_id, staged_at),
            ),
        ],
        checkpoints,
        ranges=plan.ranges_json(),
    )
    seconds["commit"] = time.perf_counter() - t1
    bad = validated.num_rows - good.num_rows - hits.num_rows
    return StageResult(
        plan, validated.num_rows, good.num_rows, bad, errors.num_rows, versions, tenants, seconds, hits.num_rows, path
    )


def run_batch(ctx: BatchContext, plan: BatchPlan) -> StageResult:
    return stage_cdc_batch(ctx.spark, ctx.lake, ctx.checkpoints, ctx.kafka_servers, plan)


# Staging is append-only: no lock (module docstring).
SPEC = StreamSpec(name=STREAM, app_id=app_id(STREAM), run_batch=run_batch)
