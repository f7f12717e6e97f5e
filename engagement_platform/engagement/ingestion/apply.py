"""Ingestion stream: one planned Kafka slice -> engagement_activity + quarantine + notifications.

compute: each Spark task reads its exact offsets and runs pipeline.yaml as one DuckDB query over the
         Arrow batch it read (ingest/record_tasks.py; the Spark parser for a pipeline without a vectorized
         form); each Spark task writes its valid rows as Parquet files into
         engagement_activity's folder (write_task.py) and hands back file actions, keys and rejected
         rows. On the driver, later copies of a key within the slice and keys engagement_activity
         already holds (at the version pinned in the data commit's metadata, streams/pin.py, so a
         re-run marks the same rows) are quarantined, and the rare file holding one is rewritten.
         Records naming an erased subject (the latest suppression list) are dropped
         in the tasks and only counted (engagement_suppressed_records, by hash).
commit:  the data files in one commit, then quarantine, the suppressed counts, then notifications (counts from the files,
         or from the data commit's change feed when an earlier attempt made it), each with the txn
         (app id, batch id); then the checkpoint says done. Files an attempt wrote but never
         committed are deleted by the next attempt of the batch (lake/file_writes.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from engagement_platform.engagement.ingestion.records import (
    KEY_SEPARATOR,
    ingestion_pipeline,
    mark_already_in_table,
    mark_duplicates_in_batch,
)
from engagement_platform.engagement.ingestion.write_task import FILES, KEYS, REJECTED, SUPPRESSED, write_task
from engagement_platform.engagement.tables import (
    ACTIVITY_LOCK,
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_ERASED_SUBJECTS,
    ENGAGEMENT_NOTIFICATIONS,
    ENGAGEMENT_SUPPRESSED_RECORDS,
    QUARANTINE_ENGAGEMENT_INGESTION,
)
from engagement_platform.ingest.errors import ERROR_FIELDS, ERRORS, RAW, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import Pipeline, QuarantineContext, quarantine_rows
from engagement_platform.ingest.record_tasks import VECTORIZED, validated_tasks
from engagement_platform.ingest.sources import INPUT, fetch_values
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.file_writes import (
    WrittenFile,
    commit_files,
    delete_uncommitted,
    read_file,
    rewrite_files,
    writer_tag,
)
from engagement_platform.lake.suppression_tables import hits_table, load_suppressed, suppressed_rows, suppressed_step
from engagement_platform.settings import load_settings
from engagement_platform.spark.handoff import HANDOFF_SCHEMA, collect_handoff
from engagement_platform.streams.batch import CommitStep, Outcomes, commit_batch, failpoint
from engagement_platform.streams.kafka import KafkaClient
from engagement_platform.streams.notify import notification_step
from engagement_platform.streams.pin import Pin, pin_batch
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.spec import BatchContext, StreamSpec, batch_metadata

STREAM = "ingestion"
APP_ID = "engagement.ingestion"
DATA_FILES = "data_files"  # the failpoint step after the executors wrote the batch's files


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
    records_suppressed: int = 0  # records naming an erased subject: dropped, stored nowhere
    record_path: str = VECTORIZED  # where the records were parsed and validated (record_tasks.record_path)

    def metadata(self) -> dict:
        return batch_metadata(
            self.plan,
            self.versions,
            self.seconds,
            records_read=self.records_read,
            rows_appended=self.rows_appended,
            rows_rejected=self.rows_rejected,
            records_suppressed=self.records_suppressed,
            record_path=self.record_path,
        )


EXISTING_SCHEMA = pa.schema([("org_id", pa.string()), ("engagement_id", pa.string()), ("batch_id", pa.int64())])


def existing_keys(lake: DeltaLake, version: int, validated: pa.Table, batch_id: int) -> pa.Table:
    """engagement_activity's (org_id, engagement_id, batch_id) at `version` for the keys of the slice's valid rows.
    Rows of batch `batch_id` itself are left out (only its own earlier attempt can have written them).

    Only the files that can hold one of the keys are read (key_files: the org's partition, and engagement_id
    min/max statistics that meet the org's keys), and only their two key columns: ids that grow over time (new
    activities) then read nothing however large the table is, instead of every id of the batch's orgs."""
    valid = validated.filter(pc.equal(pc.list_value_length(validated[ERRORS]), 0))
    if version < 0 or valid.num_rows == 0:
        return EXISTING_SCHEMA.empty_table()
    keys = valid.select(["org_id", "engagement_id"])
    files = key_files(pa.table(lake.table(ENGAGEMENT_ACTIVITY.name, version).get_add_actions(flatten=True)), keys)
    if not files:
        return EXISTING_SCHEMA.empty_table()
    uri = lake.uri(ENGAGEMENT_ACTIVITY.name)
    rows = pa.concat_tables(
        [read_file(uri, ENGAGEMENT_ACTIVITY, f, lake.storage_options, EXISTING_SCHEMA.names) for f in files]
    )
    held = pc.binary_join_element_wise(rows["org_id"], rows["engagement_id"], KEY_SEPARATOR)
    wanted = pc.binary_join_element_wise(keys["org_id"], keys["engagement_id"], KEY_SEPARATOR)
    hit = pc.and_(
        pc.is_in(held, value_set=wanted), pc.not_equal(rows["batch_id"], batch_id)
    )  # one hash set for all files
    return rows.filter(pc.fill_null(hit, False)).cast(EXISTING_SCHEMA)


def key_files(actions: pa.Table, keys: pa.Table) -> list[WrittenFile]:
    """The data files (add actions, flattened) that may hold one of `keys` (org_id, engagement_id): files of the
    keys' orgs whose engagement_id min/max meet the span of that org's keys, and every file of those orgs
    without statistics. Only the log is read."""
    if actions.num_rows == 0:
        return []
    spans = keys.group_by("org_id").aggregate([("engagement_id", "min"), ("engagement_id", "max")])
    plain = {
        name: (
            pc.cast(actions[name], pa.string())
            if name in actions.column_names
            else pa.nulls(actions.num_rows, pa.string())
        )
        for name in ("path", "partition.org_id", "min.engagement_id", "max.engagement_id")
    }
    files = pa.table(
        {
            "path": plain["path"],
            "org_id": plain["partition.org_id"],
            "low": plain["min.engagement_id"],
            "high": plain["max.engagement_id"],
        }
    )
    joined = files.join(spans, "org_id", join_type="inner")
    # Delta truncates long string statistics to a prefix (min) and a larger value (max): still bounds.
    meets = pc.and_kleene(
        pc.less_equal(joined["low"], joined["engagement_id_max"]),
        pc.greater_equal(joined["high"], joined["engagement_id_min"]),
    )
    kept = joined.filter(pc.fill_null(meets, True))  # no statistics: the file may hold anything
    # files to read, never to commit: their size and time are not needed
    return [
        WrittenFile(path, 0, {"org_id": org}, "", 0)
        for path, org in sorted(zip(kept["path"].to_pylist(), kept["org_id"].to_pylist()))
    ]


def batch_pin(lake: DeltaLake, batch_id: int) -> Pin:
    """The engagement_activity version this batch checks keys against (-1: no table): pinned in the metadata
    of its data commit once that exists (a re-run then marks the same rows), before that the current one."""
    return pin_batch(lake, ENGAGEMENT_ACTIVITY.name, APP_ID, batch_id, [ENGAGEMENT_ACTIVITY.name])


def flag_duplicates(keys: pa.Table, lake: DeltaLake, activity_version: int, batch_id: int) -> pa.Table:
    """The valid rows (their keys) that must not be appended, each with its one error: later copies of a key
    within the slice, then keys engagement_activity already holds at `activity_version`."""
    no_errors = pa.ListArray.from_arrays(
        pa.array(np.zeros(keys.num_rows + 1, np.int32)),
        pa.array([], pa.struct([(name, pa.string()) for name in ERROR_FIELDS])),
    )
    checked = keys.append_column(ERRORS, no_errors)  # built from offsets: no Python list per row
    checked, in_batch = mark_duplicates_in_batch(checked)
    checked, in_table = mark_already_in_table(checked, existing_keys(lake, activity_version, checked, batch_id))
    return checked.take(pa.array(sorted(in_batch + in_table), pa.int64()))


def with_raw_bytes(flagged: pa.Table, bootstrap_servers: str, topic: str, kafka_config: dict | None = None) -> pa.Table:
    """`flagged` with each record's raw bytes, read back from Kafka by offset (the executors kept them)."""
    positions = list(zip(flagged[SOURCE_PARTITION].to_pylist(), flagged[SOURCE_OFFSET].to_pylist()))
    raw = fetch_values(KafkaClient(bootstrap_servers, kafka_config), topic, set(positions)) if positions else {}
    return flagged.append_column(RAW, pa.array([raw.get(p) for p in positions], pa.binary())).append_column(
        INPUT, pa.nulls(flagged.num_rows, pa.string())
    )


QUARANTINED_COLUMNS = [ERRORS, SOURCE_PARTITION, SOURCE_OFFSET, "org_id", RAW, INPUT]


def quarantine_of(rejected: pa.Table | None, flagged: pa.Table, plan: BatchPlan, at: datetime) -> pa.Table:
    """One quarantine row per error: of the records Spark rejected, then of the duplicates the driver found."""
    parts = [
        t.select(QUARANTINED_COLUMNS).cast(flagged.select(QUARANTINED_COLUMNS).schema)
        for t in (rejected, flagged)
        if t is not None and t.num_rows
    ]
    bad = pa.concat_tables(parts) if parts else flagged.select(QUARANTINED_COLUMNS)
    return quarantine_rows(bad, QuarantineContext(STREAM, plan.batch_id, plan.topic, at, kafka=True))


def positions(rows: pa.Table, partition: str = SOURCE_PARTITION, offset: str = SOURCE_OFFSET) -> pa.ChunkedArray:
    """Each row's Kafka position as one comparable value ("partition:offset")."""
    return pc.binary_join_element_wise(pc.cast(rows[partition], pa.string()), pc.cast(rows[offset], pa.string()), ":")


def drop_flagged(lake: DeltaLake, files: list[WrittenFile], flagged: pa.Table, tag: str) -> list[WrittenFile]:
    """The batch's files without the flagged rows: only the files of orgs that hold one are rewritten."""
    if flagged.num_rows == 0:
        return files
    orgs = set(flagged["org_id"].to_pylist())
    dropped = positions(flagged)

    def keep(rows: pa.Table) -> pa.Array:
        return pc.invert(pc.is_in(positions(rows, "source_partition", "source_offset"), value_set=dropped))

    touched = [f for f in files if f.partition_values.get("org_id") in orgs]
    rewritten = rewrite_files(
        lake.uri(ENGAGEMENT_ACTIVITY.name), ENGAGEMENT_ACTIVITY, touched, keep, tag, lake.storage_options
    )
    return [f for f in files if f.partition_values.get("org_id") not in orgs] + rewritten


def ingest_batch(
    spark: SparkSession,
    lake: DeltaLake,
    checkpoints: CheckpointStore,
    bootstrap_servers: str,
    plan: BatchPlan,
    record_path: str = VECTORIZED,
) -> IngestResult:
    """Spark tasks parse, validate and write the valid rows as data files (written_files.py); the driver
    checks the keys for duplicates, rewrites the rare file holding one, then commits the files, the
    quarantine and the notifications, each once."""
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    pin = batch_pin(lake, plan.batch_id)
    tag = writer_tag(APP_ID, plan.batch_id)
    written = not (
        lake.exists(ENGAGEMENT_ACTIVITY.name)
        and lake.already_committed(ENGAGEMENT_ACTIVITY.name, BatchTxn(APP_ID, plan.batch_id))
    )
    if written:
        delete_uncommitted(lake, ENGAGEMENT_ACTIVITY, tag)  # what an earlier attempt wrote before it died
        lake.ensure(ENGAGEMENT_ACTIVITY)  # the table exists before any file is written into its folder
    ingested_at = datetime.now(UTC)  # this attempt's clock: the pin fixes what the keys are checked against
    # the latest suppression list, not the pinned one: an erasure between a crashed attempt and this re-run
    # must hold for every step not committed yet (retention shares the lock, so it cannot change mid-batch)
    suppressed = load_suppressed(lake, ENGAGEMENT_ERASED_SUBJECTS, load_settings().erasure.secret)
    task = write_task(
        lake.uri(ENGAGEMENT_ACTIVITY.name), tag, plan.batch_id, ingested_at, written, lake.storage_options, suppressed
    )
    pipeline = Pipeline.from_config(ingestion_pipeline(plan.topic))
    frame, path = validated_tasks(spark, pipeline, bootstrap_servers, plan, task, HANDOFF_SCHEMA, wanted=record_path)
    handed = collect_handoff(frame)
    failpoint(STREAM, DATA_FILES)  # the executors' files are written, nothing is committed
    files = [WrittenFile.from_json(text) for text in handed[FILES]["file"].to_pylist()] if FILES in handed else []
    keys = handed.get(KEYS, pa.table({c: pa.array([], t) for c, t in KEY_TYPES.items()}))
    rejected = handed.get(REJECTED)
    hits = handed.get(SUPPRESSED, hits_table([]))
    seconds["read_validate_write"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    flagged = with_raw_bytes(
        flag_duplicates(keys, lake, pin.versions[ENGAGEMENT_ACTIVITY.name], plan.batch_id),
        bootstrap_servers,
        plan.topic,
    )
    files = drop_flagged(lake, files, flagged, tag) if written else files
    errors = quarantine_of(rejected, flagged, plan, ingested_at)
    appended = {}
    for f in files:
        counts = appended.setdefault(f.partition_values["org_id"], {"inserted": 0, "updated": 0, "deleted": 0})
        counts["inserted"] += f.rows
    seconds["duplicates"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    versions = commit_batch(
        plan,
        APP_ID,
        [
            CommitStep(ENGAGEMENT_ACTIVITY.name, lambda txn, _: commit_files(lake, ENGAGEMENT_ACTIVITY, files, txn)),
            CommitStep(
                QUARANTINE_ENGAGEMENT_INGESTION.name,
                lambda txn, _: lake.append(QUARANTINE_ENGAGEMENT_INGESTION, errors, txn),
            ),
            suppressed_step(
                lake,
                ENGAGEMENT_SUPPRESSED_RECORDS,
                suppressed_rows(ENGAGEMENT_SUPPRESSED_RECORDS, hits, STREAM, plan.batch_id, ingested_at),
            ),
            notification_step(
                lake,
                ENGAGEMENT_NOTIFICATIONS,
                ENGAGEMENT_ACTIVITY.name,
                APP_ID,
                plan,
                ingested_at,
                appended_counts=appended,
            ),
        ],
        checkpoints,
        ranges=plan.ranges_json(),
        **pin.metadata(),  # read back by a re-run (batch_pin)
    )
    seconds["commit"] = time.perf_counter() - t2
    valid = keys.num_rows
    bad_records = (rejected.num_rows if rejected is not None else 0) + flagged.num_rows
    kept = pc.invert(pc.is_in(positions(keys), value_set=positions(flagged)))
    org_ids = sorted(pc.unique(keys.filter(kept)["org_id"]).to_pylist()) if valid else []
    return IngestResult(
        plan,
        valid + (rejected.num_rows if rejected is not None else 0) + hits.num_rows,
        valid - flagged.num_rows,
        bad_records,
        errors.num_rows,
        versions,
        org_ids,
        seconds,
        records_suppressed=hits.num_rows,
        record_path=path,
    )


KEY_TYPES = {
    "org_id": pa.string(),
    "engagement_id": pa.string(),
    SOURCE_PARTITION: pa.int32(),
    SOURCE_OFFSET: pa.int64(),
}


def run_batch(ctx: BatchContext, plan: BatchPlan) -> IngestResult:
    return ingest_batch(ctx.spark, ctx.lake, ctx.checkpoints, ctx.kafka_servers, plan)


SPEC = StreamSpec(name=STREAM, app_id=APP_ID, run_batch=run_batch, lock_name=ACTIVITY_LOCK)
