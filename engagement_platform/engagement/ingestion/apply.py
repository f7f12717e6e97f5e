"""Ingestion stream: one planned Kafka slice -> engagement_activity + quarantine + notifications.

compute: Spark reads the exact offsets (kafka_offsets data source); the ingest framework parses
         and validates (ingestion_pipeline.yaml); one Arrow result comes back, split into good
         rows and quarantine rows.
commit:  data table, then quarantine, then notifications (counts from the data commit's change
         feed), each with the txn (app id, batch id); then the checkpoint says done.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark.sql import SparkSession

from engagement_platform.engagement.ingestion.records import ingestion_pipeline, mark_already_in_table, mark_duplicates_in_batch
from engagement_platform.engagement.tables import (
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_NOTIFICATIONS,
    QUARANTINE_ENGAGEMENT_INGESTION,
)
from engagement_platform.ingest.errors import ERRORS, RAW, ROW_ID, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import Pipeline, QuarantineContext, quarantine_rows
from engagement_platform.ingest.sources import INPUT, read_kafka
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.notifications import inserted_counts, notification_rows
from engagement_platform.streams.batch import CommitStep, Outcomes, commit_batch
from engagement_platform.streams.kafka import KafkaClient, OffsetRange
from engagement_platform.streams.planning import BatchPlan

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
        return {
            "batch_id": self.plan.batch_id,
            "offset_ranges": self.plan.ranges_json(),
            "records_read": self.records_read,
            "rows_appended": self.rows_appended,
            "rows_rejected": self.rows_rejected,
            **{f"{k}_version": v for k, v in self.versions.items()},
            **{f"seconds_{k}": round(v, 3) for k, v in self.seconds.items()},
        }


def validate_slice(spark: SparkSession, bootstrap_servers: str, plan: BatchPlan, lake: DeltaLake, activity_version: int,
                   kafka_config: dict | None = None) -> pa.Table:
    """The ingest framework parses and validates the slice in Spark; on the driver, later copies of a key
    within the slice and keys engagement_activity already holds at `activity_version` are marked, and their
    raw bytes (which Spark returns only for rows it rejected) are read back from Kafka by offset."""
    config = ingestion_pipeline(plan.topic)
    parsed = read_kafka(spark, config.source, bootstrap_servers, plan.topic, plan.ranges_json(), kafka_config)
    validated = Pipeline.from_config(config).transform(parsed).toArrow()
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


def pinned_activity_version(lake: DeltaLake, batch_id: int) -> int:
    """The engagement_activity version this batch checks keys against: pinned in the metadata of its data commit
    once that exists (a re-run then marks the same rows), before that the current version (-1: no table)."""
    if not lake.exists(ENGAGEMENT_ACTIVITY.name):
        return -1
    commit = lake.batch_commit(ENGAGEMENT_ACTIVITY.name, APP_ID, batch_id) or {}
    return int(commit["activity_version"]) if "activity_version" in commit else lake.table(ENGAGEMENT_ACTIVITY.name).version()


def fetch_values(kafka: KafkaClient, topic: str, positions: set[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
    """Raw values at exact (partition, offset) positions (one range read per partition)."""
    spans: dict[int, list[int]] = {}
    for p, o in positions:
        spans.setdefault(p, []).append(o)
    ranges = [OffsetRange(p, min(offsets), max(offsets) + 1) for p, offsets in spans.items()]
    return {(m.partition, m.offset): m.value for m in kafka.read_range(topic, ranges) if (m.partition, m.offset) in positions}


def reject_on_driver(validated: pa.Table, errors: list, flagged: list[int], bootstrap_servers: str, topic: str,
                     kafka_config: dict | None = None) -> pa.Table:
    """`validated` with the driver's `errors` column, and raw bytes plus input JSON for the rows the
    driver rejected (`flagged`): Spark returns raw bytes only for the rows it rejected itself."""
    if not flagged:
        return validated
    rows = validated.select([SOURCE_PARTITION, SOURCE_OFFSET]).to_pylist()
    wanted = {(rows[i][SOURCE_PARTITION], rows[i][SOURCE_OFFSET]): i for i in flagged}
    raw = fetch_values(KafkaClient(bootstrap_servers, kafka_config), topic, set(wanted))
    raws, inputs = validated[RAW].to_pylist(), validated[INPUT].to_pylist()
    for position, i in wanted.items():
        raws[i] = raw.get(position)
        inputs[i] = _input_json(raws[i])
    schema = validated.schema
    return (validated.set_column(schema.get_field_index(ERRORS), ERRORS, pa.array(errors, schema.field(ERRORS).type))
            .set_column(schema.get_field_index(RAW), RAW, pa.array(raws, schema.field(RAW).type))
            .set_column(schema.get_field_index(INPUT), INPUT, pa.array(inputs, pa.string())))


def _input_json(raw: bytes | None) -> str | None:
    try:
        return json.dumps(json.loads(raw), sort_keys=True) if raw else None
    except ValueError:
        return None


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
    activity_version = pinned_activity_version(lake, plan.batch_id)
    validated = validate_slice(spark, bootstrap_servers, plan, lake, activity_version)
    seconds["read_validate"] = time.perf_counter() - t0

    ingested_at = datetime.now(timezone.utc)
    good, errors = split_rows(validated, plan, ingested_at)
    bad_records = validated.num_rows - good.num_rows

    def notify(txn: BatchTxn, done: Outcomes) -> int | None:
        version, counts = done[ENGAGEMENT_ACTIVITY.name], inserted_counts(good)
        if version is None:  # an earlier attempt committed the data: count what that commit holds
            version, counts = lake.find_batch_commit(ENGAGEMENT_ACTIVITY.name, APP_ID, plan.batch_id), None
        rows = notification_rows(lake, ENGAGEMENT_NOTIFICATIONS, ENGAGEMENT_ACTIVITY.name, version, APP_ID, plan.batch_id, ingested_at, counts)
        return lake.append(ENGAGEMENT_NOTIFICATIONS, rows, txn)

    t1 = time.perf_counter()
    versions = commit_batch(
        plan,
        APP_ID,
        [
            CommitStep(ENGAGEMENT_ACTIVITY.name, lambda txn, _: lake.append(ENGAGEMENT_ACTIVITY, good, txn)),
            CommitStep(QUARANTINE_ENGAGEMENT_INGESTION.name, lambda txn, _: lake.append(QUARANTINE_ENGAGEMENT_INGESTION, errors, txn)),
            CommitStep(ENGAGEMENT_NOTIFICATIONS.name, notify),
        ],
        checkpoints,
        ranges=plan.ranges_json(),
        activity_version=activity_version,  # read back by a re-run (pinned_activity_version)
    )
    seconds["commit"] = time.perf_counter() - t1
    org_ids = sorted(pc.unique(good["org_id"]).to_pylist())
    return IngestResult(plan, validated.num_rows, good.num_rows, bad_records, errors.num_rows, versions, org_ids, seconds)
