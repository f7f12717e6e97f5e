"""TTL / GDPR retention stream: one planned slice of `engagement.gdpr` -> one delete of
engagement_activity, the erased subjects' rows out of every other table, notifications and an audit row
per request. The request format is in requests.py.

Lifecycle (streams/batch.py; txn app id `engagement.retention`, version = batch id, stream `retention`):

compute  The ingest framework parses and validates the slice (pipeline.yaml, validate.py); the kind's
         fields, request times in the future and repeated request ids (in the batch, or already in
         gdpr_audit) are checked on the driver in the same error schema. The batch's as-of time and the
         versions of gdpr_audit and of the tables below are pinned in the first commit's metadata
         (streams/pin.py), so a re-run after a crash reaches the same decisions and counts.
         Erasure also reads each table of ERASABLE at its pinned version (only the org partitions /
         orgs involved, and quarantined records without an org) and picks, by key, the rows that
         mention a subject (requests.mentions over request JSON, raw bytes, parsed input).
commit   quarantine_engagement_gdpr (append; carries the pin), engagement_erased_subjects (the
         suppression list: the erased subjects' keyed hashes, lake/suppression.py; from this commit on
         every stream drops their records), engagement_activity (ONE delete: per org, engagement_date <
         the latest cut-off OR engagement_id IN the keys of the subjects' rows), its change log
         engagement_activity_changes (rows older than the cut-offs, and the subjects' images by key,
         redacted: the ids and free text set to null, what changed kept for incremental readers; not
         counted in the audit), each ERASABLE table (one delete by key each), engagement_notifications
         (deleted counts from the delete commit's change data feed), gdpr_audit (one row per request:
         rows removed per table; the subject as its hash). No delete names a subject id: Delta writes a
         delete's predicate into the log in clear. A delete that matches nothing writes no commit; a
         re-run then finds nothing to delete either.

Files: a delete only tombstones the files holding the rows (and writes change-data files that hold the
deleted rows too). They go when a full vacuum runs past the retention period: the layout upkeep's daily
run vacuums engagement_activity, every ERASABLE table and the change log (lake/row_erasure.py),
then drops their log entries older than half the erasure window (EP_ERASURE_WINDOW, docs/design/erasure.md).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from engagement_platform.engagement.retention.erasure import (
    ERASABLE,
    ERASED_TABLES,
    LOG_NOT_REDACTED,
    REDACTED_IN_LOG,
    WINDOW_TABLES,
    erased_activity_keys,
    erased_log_rows,
    erasure_matches,
)
from engagement_platform.engagement.retention.requests import (
    ERASURE,
    RETENTION,
    RetentionRequest,
    activity_predicate,
    activity_request,
    log_predicate,
)
from engagement_platform.engagement.retention.tables import GDPR_AUDIT, QUARANTINE_ENGAGEMENT_GDPR
from engagement_platform.engagement.retention.validate import validate_requests
from engagement_platform.engagement.tables import (
    ACTIVITY_LOCK,
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_ACTIVITY_CHANGES,
    ENGAGEMENT_ERASED_SUBJECTS,
    ENGAGEMENT_NOTIFICATIONS,
    ENGAGEMENT_SUPPRESSED_RECORDS,
)
from engagement_platform.ingest.erasure import pipeline_erasure_steps, pipelines_naming_people
from engagement_platform.ingest.errors import ERRORS, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import QuarantineContext, quarantine_rows
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.row_erasure import checkpoint_tables, commit_bytes, keyed_predicate, purge_quarantine
from engagement_platform.lake.suppression import Suppressed, subject_hash
from engagement_platform.lake.suppression_tables import (
    drop_suppressed_quarantine,
    hits_table,
    load_suppressed,
    suppressed_rows,
    suppressed_step,
)
from engagement_platform.settings import load_settings
from engagement_platform.streams.batch import CommitStep, Outcomes, commit_batch
from engagement_platform.streams.notify import notification_step
from engagement_platform.streams.pin import Pin, pin_batch
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.spec import BatchContext, StreamSpec, batch_metadata

STREAM = "retention"
APP_ID = "engagement.retention"
PIPELINE_NAME = "engagement_gdpr"
PURGE_APP_ID = "engagement.retention.purge"
PINNED = (
    GDPR_AUDIT.name,
    ENGAGEMENT_ERASED_SUBJECTS.name,
    *(e.spec.name for e in ERASABLE),
)  # versions a re-run computes against


def gdpr_topic() -> str:
    """The requests topic (EP_GDPR_TOPIC, default engagement.gdpr), read at run time."""
    return load_settings().retention.topic


def interval_seconds() -> int:
    """Seconds between retention batches (EP_RETENTION_INTERVAL_SECONDS, default one day)."""
    return load_settings().retention.interval_seconds


def vacuum_retention_hours() -> int:
    """How long removed files stay before vacuum deletes them (EP_VACUUM_RETENTION_HOURS, default 168)."""
    return load_settings().retention.vacuum_retention_hours


# ---- compute ------------------------------------------------------------------------------------


def batch_pin(lake: DeltaLake, batch_id: int) -> Pin:
    """(as-of time, versions of PINNED) of the batch: from its first commit (quarantine) once that exists, else now."""
    return pin_batch(lake, QUARANTINE_ENGAGEMENT_GDPR.name, APP_ID, batch_id, PINNED)


# ---- the batch ---------------------------------------------------------------------------------


@dataclass
class RetentionResult:
    plan: BatchPlan
    as_of: datetime
    requests_read: int
    requests_applied: int
    requests_quarantined: int  # records (a record may have several error rows)
    requests_suppressed: int  # rejected requests naming an erased subject: counted, not kept
    retention_requests: int
    erasure_requests: int
    quarantined_errors: int
    rows_removed: dict[str, int]  # per table
    versions: Outcomes
    snapshot: dict[str, int]
    erasures: list[RetentionRequest] = field(default_factory=list)
    org_ids: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    bytes_written: int = 0  # by this attempt's deletes: files rewritten without the removed rows (and change data)
    bytes_removed: int = 0  # files those deletes took out of the table (gone at the next vacuum past the window's half)

    def metadata(self) -> dict:
        return batch_metadata(
            self.plan,
            self.versions,
            self.seconds,
            as_of=self.as_of.isoformat(),
            requests_read=self.requests_read,
            requests_applied=self.requests_applied,
            requests_quarantined=self.requests_quarantined,
            requests_suppressed=self.requests_suppressed,
            retention_requests=self.retention_requests,
            erasure_requests=self.erasure_requests,
            rows_removed=sum(self.rows_removed.values()),
            **{f"rows_removed_{t}": n for t, n in self.rows_removed.items()},
            bytes_rewritten=self.bytes_written,
            bytes_removed=self.bytes_removed,
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
    secret = load_settings().erasure.secret
    pin = batch_pin(lake, batch)
    as_of, snapshot = pin.as_of, pin.versions
    t0 = time.perf_counter()
    validated, requests = validate_requests(
        spark, lake, bootstrap_servers, plan, as_of, snapshot[GDPR_AUDIT.name], kafka_config
    )
    seconds["read_validate"] = time.perf_counter() - t0
    n_errors = pc.list_value_length(validated[ERRORS])
    quarantine = quarantine_rows(
        validated.filter(pc.greater(n_errors, 0)),
        QuarantineContext(PIPELINE_NAME, batch, plan.topic, as_of, kafka=True),
    )
    # A request naming an erased subject (a repeated erasure, say) is not kept raw in quarantine: counted instead.
    suppressed = load_suppressed(lake, ENGAGEMENT_ERASED_SUBJECTS, secret, snapshot[ENGAGEMENT_ERASED_SUBJECTS.name])
    erasing = Suppressed.of_subjects(
        secret, ((r.org_id, r.subject_id) for r in requests if r is not None and r.kind == ERASURE)
    )
    quarantine, hits = drop_suppressed_quarantine(
        quarantine, Suppressed.of(secret, suppressed.pairs() | erasing.pairs())
    )
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
        # the erased rows by key, found now: the lock keeps every other writer of the table out until the batch is done
        predicate = activity_predicate(ordered, erased_activity_keys(lake, erasures))
        if predicate is None:
            return None
        metrics = lake.delete(ENGAGEMENT_ACTIVITY, predicate, txn)
        # delta-rs writes no commit when nothing matched: report "nothing committed" like a re-run
        return metrics["version"] if metrics and metrics.get("num_deleted_rows") else None

    def change_log_redact(txn: BatchTxn, _: Outcomes) -> int | None:
        """The log holds the same columns (and personal data): its rows older than the cut-offs, and its images of
        the erased subjects (named by key), keep only what says what changed (redact_in_log). Deleting them would
        lose changes: a consumer that had not read a logged delete yet would count the row forever."""
        if not lake.exists(ENGAGEMENT_ACTIVITY_CHANGES.name):
            return None
        terms = [
            p
            for p in (
                activity_predicate([r for r in ordered if r.kind == RETENTION]),
                log_predicate(erased_log_rows(lake, erasures)),
            )
            if p
        ]
        if not terms:
            return None
        predicate = f"({' OR '.join(f'({p})' for p in terms)}) AND ({LOG_NOT_REDACTED})"
        metrics = lake.update(ENGAGEMENT_ACTIVITY_CHANGES, {c: "NULL" for c in REDACTED_IN_LOG}, predicate, txn)
        return metrics["version"] if metrics and metrics.get("num_updated_rows") else None

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
        if version is None and lake.exists(
            ENGAGEMENT_ACTIVITY.name
        ):  # committed by an earlier attempt, or nothing matched
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
        return lake.append(GDPR_AUDIT, _audit_rows(applied, removed, plan, as_of, datetime.now(UTC), secret), txn)

    landing_removed: dict[str, int] = {}
    t2 = time.perf_counter()
    versions = commit_batch(
        plan,
        APP_ID,
        [
            CommitStep(
                QUARANTINE_ENGAGEMENT_GDPR.name, lambda txn, _: lake.append(QUARANTINE_ENGAGEMENT_GDPR, quarantine, txn)
            ),
            # the suppression list first: from here on every stream drops the subjects' records
            suppressed_step(lake, ENGAGEMENT_ERASED_SUBJECTS, _erased_rows(erasures, secret, plan, as_of)),
            suppressed_step(
                lake,
                ENGAGEMENT_SUPPRESSED_RECORDS,
                suppressed_rows(ENGAGEMENT_SUPPRESSED_RECORDS, hits_table(hits), STREAM, batch, as_of),
            ),
            CommitStep(ENGAGEMENT_ACTIVITY.name, activity_step),
            CommitStep(ENGAGEMENT_ACTIVITY_CHANGES.name, change_log_redact),
            *[CommitStep(e.spec.name, keyed_step(e)) for e in ERASABLE],
            # landing pipelines whose records name this lake's people (their `suppression:` section)
            *pipeline_erasure_steps(
                lake,
                pipelines_naming_people(load_settings().pipelines_dir, ENGAGEMENT_ERASED_SUBJECTS.name),
                Suppressed.of_subjects(secret, ((r.org_id, r.subject_id) for r in erasures)),
                landing_removed,
            ),
            notification_step(lake, ENGAGEMENT_NOTIFICATIONS, ENGAGEMENT_ACTIVITY.name, APP_ID, plan, as_of),
            CommitStep(GDPR_AUDIT.name, audit),
        ],
        checkpoints,
        ranges=plan.ranges_json(),
        **pin.metadata(),  # in every commit's metadata; the first commit's is read back by a re-run (batch_pin)
    )
    if erasures:
        # refused requests of earlier batches naming a subject erased now (its own txn: the batch already
        # appended to that quarantine; idempotent, so a re-run just finds nothing)
        purged = purge_quarantine(
            lake, QUARANTINE_ENGAGEMENT_GDPR, load_suppressed(lake, ENGAGEMENT_ERASED_SUBJECTS, secret), PURGE_APP_ID
        )
        # log cleanup can then drop every entry from before the erasure (lake/row_erasure.py)
        touched = [t for t, v in versions.items() if v is not None and t in WINDOW_TABLES]
        checkpoint_tables(lake, touched + ([QUARANTINE_ENGAGEMENT_GDPR.name] if purged else []))
    seconds["commit"] = time.perf_counter() - t2
    totals = {**{t: sum(c[t] for c in removed.values()) for t in ERASED_TABLES}, **landing_removed}
    rewritten = [
        commit_bytes(lake, t, v)
        for t, v in versions.items()
        if v is not None and t in (*WINDOW_TABLES, *landing_removed)
    ]
    return RetentionResult(
        plan=plan,
        as_of=as_of,
        requests_read=validated.num_rows,
        requests_applied=len(ordered),
        requests_quarantined=validated.num_rows - len(ordered) - len(hits),
        requests_suppressed=len(hits),
        retention_requests=sum(r.kind == RETENTION for r in ordered),
        erasure_requests=len(erasures),
        quarantined_errors=quarantine.num_rows,
        rows_removed=totals,
        versions=versions,
        snapshot=snapshot,
        erasures=erasures,
        org_ids=sorted({r.org_id for r in ordered}),
        seconds=seconds,
        bytes_written=sum(a for a, _ in rewritten),
        bytes_removed=sum(r for _, r in rewritten),
    )


def _audit_rows(
    applied: list[tuple[RetentionRequest, dict]],
    removed: dict[str, dict[str, int]],
    plan: BatchPlan,
    as_of: datetime,
    completed_at: datetime,
    secret: bytes,
) -> pa.Table:
    """One row per request; an erasure's subject as its keyed hash only (in subject_hash and in the request JSON)."""
    rows = []
    for r, p in applied:
        counts = removed[r.request_id]
        digest = subject_hash(secret, r.org_id, r.subject_id) if r.kind == ERASURE else None
        request = {k: v for k, v in r.to_json().items() if k != "subject_id"} | (
            {"subject_hash": digest} if digest else {}
        )
        rows.append(
            dict(
                org_id=r.org_id,
                request_id=r.request_id,
                kind=r.kind,
                subject_hash=digest,
                retention_days=r.retention_days,
                cutoff_date=r.cutoff,
                request_time=r.request_time,
                received_at=as_of,
                completed_at=completed_at,
                rows_removed=sum(counts.values()),
                rows_removed_by_table=json.dumps(counts, sort_keys=True),
                request_json=json.dumps(request, sort_keys=True),
                batch_id=plan.batch_id,
                source_partition=p[SOURCE_PARTITION],
                source_offset=p[SOURCE_OFFSET],
            )
        )
    return pa.Table.from_pylist(rows, schema=GDPR_AUDIT.schema)


def _erased_rows(erasures: list[RetentionRequest], secret: bytes, plan: BatchPlan, as_of: datetime) -> pa.Table:
    """The suppression list's rows of this batch's erasures."""
    return pa.Table.from_pylist(
        [
            dict(
                org_id=r.org_id,
                subject_hash=subject_hash(secret, r.org_id, r.subject_id),
                request_id=r.request_id,
                erased_at=as_of,
                batch_id=plan.batch_id,
            )
            for r in erasures
        ],
        schema=ENGAGEMENT_ERASED_SUBJECTS.schema,
    )


def audited_erasures(lake: DeltaLake, batch_id: int | None = None) -> list[tuple[str, str]]:
    """(org, subject hash) of the erasures one batch (None: every batch) applied, from gdpr_audit."""
    if not lake.exists(GDPR_AUDIT.name):
        return []
    filters = [("kind", "=", ERASURE)] + ([("batch_id", "=", batch_id)] if batch_id is not None else [])
    rows = lake.read(GDPR_AUDIT.name, filters=filters, columns=["org_id", "subject_hash"]).to_pylist()
    return [(r["org_id"], r["subject_hash"]) for r in rows]


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
    now = now or datetime.now(UTC)
    return max((planned_at - now).total_seconds() + interval, 0.0)


def run_batch(ctx: BatchContext, plan: BatchPlan) -> RetentionResult:
    return apply_retention_batch(ctx.spark, ctx.lake, ctx.checkpoints, ctx.kafka_servers, plan)


SPEC = StreamSpec(name=STREAM, app_id=APP_ID, run_batch=run_batch, lock_name=ACTIVITY_LOCK)
