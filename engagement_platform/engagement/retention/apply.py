"""TTL / GDPR retention stream: one planned slice of `engagement.gdpr` -> one delete of
engagement_activity, the erased subjects' rows out of every other table, notifications and an audit row
per request. The request format is in requests.py.

Lifecycle (streams/batch.py; txn app id `engagement.retention`, version = batch id, stream `retention`):

compute  The ingest framework parses and validates the slice (pipeline.yaml); the kind's
         fields, request times in the future and repeated request ids (in the batch, or already in
         gdpr_audit) are checked on the driver in the same error schema. The batch's as-of time and the
         versions of gdpr_audit and of the tables below are pinned in the first commit's metadata
         (streams/pin.py), so a re-run after a crash reaches the same decisions and counts.
         Erasure also reads each table of ERASABLE at its pinned version (only the org partitions /
         orgs involved, and quarantined records without an org) and picks, by key, the rows that
         mention a subject (requests.mentions over request JSON, raw bytes, parsed input).
commit   quarantine_engagement_gdpr (append; carries the pin), engagement_activity (ONE delete: per
         org, engagement_date < the latest cut-off OR lead_id/contact_id IN the erased subjects), the
         same delete of its change log engagement_activity_changes (same columns; not counted in the
         audit), each ERASABLE table (one delete by key each), engagement_notifications (deleted counts from the
         delete commit's change data feed), gdpr_audit (one row per request: rows removed per table).
         A delete that matches nothing writes no commit; a re-run then finds nothing to delete either.

Files: a delete only tombstones the files holding the rows (and writes change-data files that hold the
deleted rows too). They go when a full vacuum runs past the retention period: the layout upkeep's daily
run vacuums engagement_activity and, through `vacuum_erased_tables`, every ERASABLE table and the change log.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark.sql import SparkSession

from engagement_platform.engagement.retention.erasure import ERASABLE, ERASED_TABLES, erasure_matches, read_at
from engagement_platform.engagement.retention.requests import (
    ERASURE, RETENTION, RetentionRequest, activity_predicate, activity_request, canonical_request, error, keyed_predicate,
)
from engagement_platform.engagement.retention.tables import GDPR_AUDIT, QUARANTINE_ENGAGEMENT_GDPR
from engagement_platform.engagement.tables import ACTIVITY_LOCK, ENGAGEMENT_ACTIVITY, ENGAGEMENT_ACTIVITY_CHANGES, ENGAGEMENT_NOTIFICATIONS
from engagement_platform.ingest.config import PipelineConfig, load_kafka_pipeline
from engagement_platform.ingest.errors import ERRORS, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import QuarantineContext, quarantine_rows, reject_on_driver, validate_kafka_slice
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.settings import load_settings
from engagement_platform.streams.batch import CommitStep, Outcomes, commit_batch
from engagement_platform.streams.notify import notification_step
from engagement_platform.streams.pin import Pin, pin_batch
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.spec import BatchContext, StreamSpec, batch_metadata

STREAM = "retention"
APP_ID = "engagement.retention"
PIPELINE_NAME = "engagement_gdpr"
PIPELINE_FILE = Path(__file__).with_name("pipeline.yaml")
PINNED = (GDPR_AUDIT.name, *(e.spec.name for e in ERASABLE))  # versions a re-run computes against


def gdpr_topic() -> str:
    """The requests topic (EP_GDPR_TOPIC, default engagement.gdpr), read at run time."""
    return load_settings().retention.topic


def interval_seconds() -> int:
    """Seconds between retention batches (EP_RETENTION_INTERVAL_SECONDS, default one day)."""
    return load_settings().retention.interval_seconds


def vacuum_retention_hours() -> int:
    """How long removed files stay before vacuum deletes them (EP_VACUUM_RETENTION_HOURS, default 168)."""
    return load_settings().retention.vacuum_retention_hours


def retention_pipeline(topic: str) -> PipelineConfig:
    return load_kafka_pipeline(PIPELINE_FILE, topic)


# ---- compute ------------------------------------------------------------------------------------


def batch_pin(lake: DeltaLake, batch_id: int) -> Pin:
    """(as-of time, versions of PINNED) of the batch: from its first commit (quarantine) once that exists, else now."""
    return pin_batch(lake, QUARANTINE_ENGAGEMENT_GDPR.name, APP_ID, batch_id, PINNED)


def _audited(lake: DeltaLake, version: int, requests: list[RetentionRequest], batch_id: int) -> set[tuple[str, str]]:
    """(org_id, request_id) of these requests an earlier batch already applied (a producer retry)."""
    if not requests:
        return set()
    expr = (ds.field("org_id").isin(sorted({r.org_id for r in requests}))
            # cast: string_view in files a delta-rs delete rewrote (see erasure.activity_rows_of_subjects)
            & ds.field("request_id").cast(pa.string()).isin(sorted({r.request_id for r in requests})) & (ds.field("batch_id") < batch_id))
    rows = read_at(lake, GDPR_AUDIT.name, version, expr, ["org_id", "request_id"])
    return {(r["org_id"], r["request_id"]) for r in rows.to_pylist()}


def validate_requests(spark: SparkSession, lake: DeltaLake, bootstrap_servers: str, plan: BatchPlan, as_of: datetime,
                      audit_version: int, kafka_config: dict | None = None) -> tuple[pa.Table, list[RetentionRequest | None]]:
    """(validated slice with every error in `_errors`, request per row or None if quarantined)."""
    validated = validate_kafka_slice(spark, retention_pipeline(plan.topic), bootstrap_servers, plan, kafka_config)
    validated = validated.sort_by([(SOURCE_PARTITION, "ascending"), (SOURCE_OFFSET, "ascending")])
    rows, errors = validated.to_pylist(), validated[ERRORS].to_pylist()
    requests: list[RetentionRequest | None] = [None] * len(rows)
    flagged, candidates = [], {}
    for i, row in enumerate(rows):
        if errors[i]:
            continue
        request, found = canonical_request(row, as_of)
        if found:
            errors[i] = found
            flagged.append(i)
        else:
            candidates[i] = request
    earlier = _audited(lake, audit_version, list(candidates.values()), plan.batch_id)
    seen: set[tuple[str, str]] = set()
    for i, r in candidates.items():
        key = (r.org_id, r.request_id)
        if key in seen:
            errors[i] = [error("request_id", "duplicate_in_batch", f"request_id '{r.request_id}' already appears earlier in this batch", r.request_id)]
        elif key in earlier:
            errors[i] = [error("request_id", "duplicate_request", f"request_id '{r.request_id}' was already applied by an earlier batch", r.request_id)]
        else:
            seen.add(key)
            requests[i] = r
            continue
        flagged.append(i)
    validated = reject_on_driver(validated, errors, flagged, bootstrap_servers, plan.topic, kafka_config)
    return validated, requests


# ---- the batch ---------------------------------------------------------------------------------


@dataclass
class RetentionResult:
    plan: BatchPlan
    as_of: datetime
    requests_read: int
    requests_applied: int
    requests_quarantined: int  # records (a record may have several error rows)
    retention_requests: int
    erasure_requests: int
    quarantined_errors: int
    rows_removed: dict[str, int]  # per table
    versions: Outcomes
    snapshot: dict[str, int]
    erasures: list[RetentionRequest] = field(default_factory=list)
    org_ids: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def metadata(self) -> dict:
        return batch_metadata(
            self.plan, self.versions, self.seconds,
            as_of=self.as_of.isoformat(),
            requests_read=self.requests_read,
            requests_applied=self.requests_applied,
            requests_quarantined=self.requests_quarantined,
            retention_requests=self.retention_requests,
            erasure_requests=self.erasure_requests,
            rows_removed=sum(self.rows_removed.values()),
            **{f"rows_removed_{t}": n for t, n in self.rows_removed.items()},
            org_ids=",".join(self.org_ids),
        )


def apply_retention_batch(
    spark: SparkSession,
    lake: DeltaLake,
    checkpoints: CheckpointStore,
    bootstrap_servers: str,
    plan: BatchPlan,
    kafka_config: dict | None = None,
) -> RetentionResult:
    seconds: dict[str, float] = {}
    batch = plan.batch_id
    pin = batch_pin(lake, batch)
    as_of, snapshot = pin.as_of, pin.versions
    t0 = time.perf_counter()
    validated, requests = validate_requests(spark, lake, bootstrap_servers, plan, as_of, snapshot[GDPR_AUDIT.name], kafka_config)
    seconds["read_validate"] = time.perf_counter() - t0
    n_errors = pc.list_value_length(validated[ERRORS])
    quarantine = quarantine_rows(validated.filter(pc.greater(n_errors, 0)), QuarantineContext(PIPELINE_NAME, batch, plan.topic, as_of, kafka=True))
    positions = validated.select([SOURCE_PARTITION, SOURCE_OFFSET]).to_pylist()
    applied = sorted(((r, p) for r, p in zip(requests, positions) if r is not None), key=lambda rp: rp[0].order)
    ordered = [r for r, _ in applied]
    erasures = [r for r in ordered if r.kind == ERASURE]

    # -- erasure outside engagement_activity: rows picked by key at the pinned versions
    t1 = time.perf_counter()
    removed: dict[str, dict[str, int]] = {r.request_id: {t: 0 for t in ERASED_TABLES} for r in ordered}
    keys: dict[str, set[tuple[str, str]]] = {}
    for e in ERASABLE:
        matches = erasure_matches(lake, e, snapshot[e.spec.name], erasures)
        keys[e.spec.name] = {k for k, _ in matches}
        for _, rid in matches:
            removed[rid][e.spec.name] += 1
    seconds["find_subjects"] = time.perf_counter() - t1

    def activity_step(txn: BatchTxn, _: Outcomes) -> int | None:
        predicate = activity_predicate(ordered)
        if predicate is None:
            return None
        metrics = lake.delete(ENGAGEMENT_ACTIVITY, predicate, txn)
        # delta-rs writes no commit when nothing matched: report "nothing committed" like a re-run
        return metrics["version"] if metrics and metrics.get("num_deleted_rows") else None

    def change_log_delete(txn: BatchTxn, _: Outcomes) -> int | None:
        """The log holds the same columns (and personal data): the same predicate erases and expires its rows."""
        predicate = activity_predicate(ordered)
        if predicate is None or not lake.exists(ENGAGEMENT_ACTIVITY_CHANGES.name):
            return None
        metrics = lake.delete(ENGAGEMENT_ACTIVITY_CHANGES, predicate, txn)
        return metrics["version"] if metrics and metrics.get("num_deleted_rows") else None

    def keyed_step(e):
        def step(txn: BatchTxn, _: Outcomes) -> int | None:
            predicate = keyed_predicate(e.key, keys[e.spec.name])
            if predicate is None:
                return None
            metrics = lake.delete(e.spec, predicate, txn)
            return metrics["version"] if metrics and metrics.get("num_deleted_rows") else None
        return step

    def activity_version(done: Outcomes) -> int | None:
        version = done.get(ENGAGEMENT_ACTIVITY.name)
        if version is None and lake.exists(ENGAGEMENT_ACTIVITY.name):  # committed by an earlier attempt, or nothing matched
            version = lake.find_batch_commit(ENGAGEMENT_ACTIVITY.name, APP_ID, batch)
        return version

    def audit(txn: BatchTxn, done: Outcomes) -> int | None:
        version = activity_version(done)
        if version is not None:  # the delete's change data feed says which rows went; attribute each to its request
            deleted = lake.changes(ENGAGEMENT_ACTIVITY.name, version, version)
            deleted = deleted.filter(pc.equal(deleted["_change_type"], "delete"))
            for row in deleted.select(["org_id", "engagement_date", "lead_id", "contact_id"]).to_pylist():
                r = activity_request(row, ordered)
                if r is not None:
                    removed[r.request_id][ENGAGEMENT_ACTIVITY.name] += 1
        return lake.append(GDPR_AUDIT, _audit_rows(applied, removed, plan, as_of, datetime.now(timezone.utc)), txn)

    t2 = time.perf_counter()
    versions = commit_batch(
        plan,
        APP_ID,
        [
            CommitStep(QUARANTINE_ENGAGEMENT_GDPR.name, lambda txn, _: lake.append(QUARANTINE_ENGAGEMENT_GDPR, quarantine, txn)),
            CommitStep(ENGAGEMENT_ACTIVITY.name, activity_step),
            CommitStep(ENGAGEMENT_ACTIVITY_CHANGES.name, change_log_delete),
            *[CommitStep(e.spec.name, keyed_step(e)) for e in ERASABLE],
            notification_step(lake, ENGAGEMENT_NOTIFICATIONS, ENGAGEMENT_ACTIVITY.name, APP_ID, plan, as_of),
            CommitStep(GDPR_AUDIT.name, audit),
        ],
        checkpoints,
        ranges=plan.ranges_json(),
        **pin.metadata(),  # in every commit's metadata; the first commit's is read back by a re-run (batch_pin)
    )
    seconds["commit"] = time.perf_counter() - t2
    totals = {t: sum(c[t] for c in removed.values()) for t in ERASED_TABLES}
    return RetentionResult(
        plan=plan, as_of=as_of, requests_read=validated.num_rows, requests_applied=len(ordered),
        requests_quarantined=validated.num_rows - len(ordered),
        retention_requests=sum(r.kind == RETENTION for r in ordered), erasure_requests=len(erasures),
        quarantined_errors=quarantine.num_rows, rows_removed=totals, versions=versions, snapshot=snapshot,
        erasures=erasures, org_ids=sorted({r.org_id for r in ordered}), seconds=seconds,
    )


def _audit_rows(applied: list[tuple[RetentionRequest, dict]], removed: dict[str, dict[str, int]], plan: BatchPlan,
                as_of: datetime, completed_at: datetime) -> pa.Table:
    rows = []
    for r, p in applied:
        counts = removed[r.request_id]
        rows.append(dict(
            org_id=r.org_id, request_id=r.request_id, kind=r.kind, subject_id=r.subject_id, retention_days=r.retention_days,
            cutoff_date=r.cutoff, request_time=r.request_time, received_at=as_of, completed_at=completed_at,
            rows_removed=sum(counts.values()), rows_removed_by_table=json.dumps(counts, sort_keys=True),
            request_json=json.dumps(r.to_json(), sort_keys=True), batch_id=plan.batch_id,
            source_partition=p[SOURCE_PARTITION], source_offset=p[SOURCE_OFFSET],
        ))
    return pa.Table.from_pylist(rows, schema=GDPR_AUDIT.schema)


def audited_erasures(lake: DeltaLake, batch_id: int) -> list[RetentionRequest]:
    """The erasures one batch applied, from gdpr_audit (what the check verifies, independent of the run)."""
    if not lake.exists(GDPR_AUDIT.name):
        return []
    rows = lake.read(GDPR_AUDIT.name, filters=[("batch_id", "=", batch_id), ("kind", "=", ERASURE)]).to_pylist()
    return [RetentionRequest(r["request_id"], r["org_id"], r["request_time"], ERASURE, subject_id=r["subject_id"]) for r in rows]


def seconds_until_due(checkpoints: CheckpointStore, interval: int, now: datetime | None = None) -> float:
    """The stream's cadence: seconds until the next batch may be planned (0 when due). A planned batch
    that is not done yet is always due (the sensor retries it); otherwise the interval counts from when
    the latest batch was planned."""
    rows = checkpoints.rows(STREAM)
    plans = rows.filter(pc.equal(rows["process"], "plan"))
    if plans.num_rows == 0:
        return 0.0
    latest = pc.max(plans["batch_id"]).as_py()
    if not checkpoints.is_done(STREAM, latest):
        return 0.0
    planned_at = pc.max(plans.filter(pc.equal(plans["batch_id"], latest))["recorded_at"]).as_py()
    now = now or datetime.now(timezone.utc)
    return max((planned_at - now).total_seconds() + interval, 0.0)


def run_batch(ctx: BatchContext, plan: BatchPlan) -> RetentionResult:
    return apply_retention_batch(ctx.spark, ctx.lake, ctx.checkpoints, ctx.kafka_servers, plan)


SPEC = StreamSpec(name=STREAM, app_id=APP_ID, run_batch=run_batch, lock_name=ACTIVITY_LOCK)
