"""Ingestion stream: one planned Kafka slice -> engagement_activity + quarantine + notifications.

compute: Spark reads the exact offsets (kafka_offsets data source); the ingest framework parses
         and validates (pipeline.yaml); one Arrow result comes back, split into good rows and
         quarantine rows. Keys engagement_activity already holds are checked at the version pinned
         in the data commit's metadata (streams/pin.py), so a re-run marks the same rows.
commit:  data table, then quarantine, then notifications (counts from the appended rows, or from the
         data commit's change feed when an earlier attempt made it), each with the txn (app id,
         batch id); then the checkpoint says done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark.sql import SparkSession

from engagement_platform.engagement.ingestion.records import ingestion_pipeline, mark_already_in_table, mark_duplicates_in_batch
from engagement_platform.engagement.tables import (
    ACTIVITY_LOCK,
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_NOTIFICATIONS,
    QUARANTINE_ENGAGEMENT_INGESTION,
)
from engagement_platform.ingest.errors import ERRORS, RAW, ROW_ID, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import QuarantineContext, quarantine_rows, validate_kafka_slice
from engagement_platform.ingest.sources import INPUT, fetch_values
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.streams.batch import CommitStep, Outcomes, commit_batch
from engagement_platform.streams.kafka import KafkaClient
from engagement_platform.streams.notify import notification_step
from engagement_platform.streams.pin import Pin, pin_batch
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.spec import BatchContext, StreamSpec, batch_metadata

STREAM = "ingestion"
APP_ID = "engagement.ingestion"


@dataclass
class IngestResult:
    plan: BatchPlan
    records_read: int
    rows_appended: int
    rows_rejected: int
    errors: int
    versions: Outcomes
    org_ids: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def metadata(self) -> dict:
        return batch_metadata(self.plan, self.versions, self.seconds, records_read=self.records_read,
                              rows_appended=self.rows_appended, rows_rejected=self.rows_rejected)


def validate_slice(spark: SparkSession, bootstrap_servers: str, plan: BatchPlan, lake: DeltaLake, activity_version: int,
                   kafka_config: dict | None = None) -> pa.Table:
    """The ingest framework parses and validates the slice in Spark; on the driver, later copies of a key
    within the slice and keys engagement_activity already holds at `activity_version` are marked, and their
    raw bytes (which Spark returns only for rows it rejected) are read back from Kafka by offset."""
    validated = validate_kafka_slice(spark, ingestion_pipeline(plan.topic), bootstrap_servers, plan, kafka_config)
    validated, in_batch = mark_duplicates_in_batch(validated)
    validated, in_table = mark_already_in_table(validated, existing_keys(lake, activity_version, validated, plan.batch_id))
    flagged = in_batch + in_table
    if flagged:
        wanted = {(validated[SOURCE_PARTITION][i].as_py(), validated[SOURCE_OFFSET][i].as_py()): i for i in flagged}
        raw = fetch_values(KafkaClient(bootstrap_servers, kafka_config), plan.topic, set(wanted))
        values = validated[RAW].to_pylist()
        for position, i in wanted.items():
            values[i] = raw[position]
        validated = validated.set_column(validated.schema.get_field_index(RAW), RAW, pa.array(values, pa.binary()))
    return validated


EXISTING_SCHEMA = pa.schema([("org_id", pa.string()), ("engagement_id", pa.string()), ("batch_id", pa.int64())])


def existing_keys(lake: DeltaLake, version: int, validated: pa.Table, batch_id: int) -> pa.Table:
    """engagement_activity's (org_id, engagement_id, batch_id) at `version` for the keys of the slice's valid rows:
    the orgs' partitions, files pruned by their engagement_id min/max, only those three columns read. Rows of
    batch `batch_id` itself are left out (only its own earlier attempt can have written them)."""
    valid = validated.filter(pc.equal(pc.list_value_length(validated[ERRORS]), 0))
    if version < 0 or valid.num_rows == 0:
        return EXISTING_SCHEMA.empty_table()
    # Compared through a cast: files a delta-rs MERGE/delete rewrote store strings as string_view, whose
    # min/max pyarrow cannot compare with a plain string literal.
    expr = (ds.field("org_id").isin(pc.unique(valid["org_id"]).to_pylist())
            & pc.field("engagement_id").cast(pa.string()).isin(pc.unique(valid["engagement_id"]))
            & (ds.field("batch_id") != batch_id))
    rows = lake.table(ENGAGEMENT_ACTIVITY.name, version).to_pyarrow_dataset().to_table(columns=EXISTING_SCHEMA.names, filter=expr)
    return rows.cast(EXISTING_SCHEMA)


def batch_pin(lake: DeltaLake, batch_id: int) -> Pin:
    """The engagement_activity version this batch checks keys against (-1: no table): pinned in the metadata
    of its data commit once that exists (a re-run then marks the same rows), before that the current one."""
    return pin_batch(lake, ENGAGEMENT_ACTIVITY.name, APP_ID, batch_id, [ENGAGEMENT_ACTIVITY.name])


def split_rows(validated: pa.Table, plan: BatchPlan, ingested_at: datetime) -> tuple[pa.Table, pa.Table]:
    """(rows for engagement_activity, one quarantine row per error of each bad record)."""
    n_errors = pc.list_value_length(validated[ERRORS])
    good = validated.filter(pc.equal(n_errors, 0))
    n = good.num_rows
    good = (
        good.drop_columns([ERRORS, RAW, INPUT, ROW_ID])
        .rename_columns({SOURCE_PARTITION: "source_partition", SOURCE_OFFSET: "source_offset"})
        .append_column("ingestion_time", pa.array([ingested_at] * n, pa.timestamp("us", tz="UTC")))
        .append_column("batch_id", pa.array([plan.batch_id] * n, pa.int64()))
    )
    context = QuarantineContext(STREAM, plan.batch_id, plan.topic, ingested_at, kafka=True)
    return good, quarantine_rows(validated.filter(pc.greater(n_errors, 0)), context)


def ingest_batch(
    spark: SparkSession,
    lake: DeltaLake,
    checkpoints: CheckpointStore,
    bootstrap_servers: str,
    plan: BatchPlan,
) -> IngestResult:
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    pin = batch_pin(lake, plan.batch_id)
    validated = validate_slice(spark, bootstrap_servers, plan, lake, pin.versions[ENGAGEMENT_ACTIVITY.name])
    seconds["read_validate"] = time.perf_counter() - t0

    ingested_at = datetime.now(timezone.utc)  # this attempt's clock: the pin fixes what the keys are checked against
    good, errors = split_rows(validated, plan, ingested_at)
    bad_records = validated.num_rows - good.num_rows

    t1 = time.perf_counter()
    versions = commit_batch(
        plan,
        APP_ID,
        [
            CommitStep(ENGAGEMENT_ACTIVITY.name, lambda txn, _: lake.append(ENGAGEMENT_ACTIVITY, good, txn)),
            CommitStep(QUARANTINE_ENGAGEMENT_INGESTION.name, lambda txn, _: lake.append(QUARANTINE_ENGAGEMENT_INGESTION, errors, txn)),
            notification_step(lake, ENGAGEMENT_NOTIFICATIONS, ENGAGEMENT_ACTIVITY.name, APP_ID, plan, ingested_at, appended=good),
        ],
        checkpoints,
        ranges=plan.ranges_json(),
        **pin.metadata(),  # read back by a re-run (batch_pin)
    )
    seconds["commit"] = time.perf_counter() - t1
    org_ids = sorted(pc.unique(good["org_id"]).to_pylist())
    return IngestResult(plan, validated.num_rows, good.num_rows, bad_records, errors.num_rows, versions, org_ids, seconds)


def run_batch(ctx: BatchContext, plan: BatchPlan) -> IngestResult:
    return ingest_batch(ctx.spark, ctx.lake, ctx.checkpoints, ctx.kafka_servers, plan)


SPEC = StreamSpec(name=STREAM, app_id=APP_ID, run_batch=run_batch, lock_name=ACTIVITY_LOCK)
