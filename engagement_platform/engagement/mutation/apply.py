"""ID mutation stream: one planned slice of `engagement.mutations` -> one commit of engagement_activity's
rewritten files, plus the request log, the change log, the pending requests, quarantine and notifications.

Requests: their JSON format is in validate.py.

Lifecycle (streams/batch.py; txn app id `engagement.mutation`, version = batch id, stream `mutation`):

compute  The ingest framework parses and validates the slice (pipeline.yaml: required fields, op and
         owner-field enums, timestamp/date types); what depends on the op, the JSON shapes of
         from_ids/record, date order and duplicate request ids are checked on the driver in the same
         error schema (validate.py, request_columns.check_requests). From there the batch is one Arrow
         table, a row per request (new valid ones plus every pending one, pending.CANDIDATE_SCHEMA).
plan     The driver plans which files each org reads from the Delta log alone (affected_rows.plan_files:
         the orgs' partitions, and min/max engagement_date stats when every request of an org is bounded).
execute  One Spark job (on_executors.py): the requests go to the executors partitioned by org, with the
         plan; each task, for a chunk of its orgs at a time (rewrite_task.py), reads the planned files
         once, keeps the rows holding an id or engagement involved, holds back requests whose targets
         are missing (hold_back, below), reduces the rest of each org once with the exact fold
         (reduction/fold.reduce_requests), computes every row's outcome column-wise (outcome_table),
         writes each touched file anew into the table's folder and hands back file actions, row-level
         changes (pre/post-images, deletes), held-back requests and counts (org_outcome.py: the
         computation, free of Spark). Table rows never come to the driver.
pending  A request whose external target (fold.external_targets: an id or engagement no earlier
         request of the batch produced) has no row in the table within the request's date range is
         held back whole, and the org's targets are looked up again without it until none is missing (a
         request that needed what a held-back request would have produced is then held back too, so a
         chain keeps its order). Held-back requests go to the pending table and are retried in each of
         the next `horizon_batches` batches, for at most EP_MUTATION_PENDING_MAX_AGE_HOURS after the batch
         that first held them back (both measured at the batch's pinned as-of time); then they are
         quarantined with `target_not_found_within_horizon`, the message naming the horizon that ran out.
commit   request log (append), engagement_activity (ONE commit of the tasks' adds and removes,
         activity_commit.py, which also says when a re-run falls back to a MERGE), the change log
         engagement_activity_changes (the commit's row-level changes: file actions carry no change-data
         files), pending (one MERGE: upsert kept, delete consumed; requests an erasure deleted after the
         pin are not written back, pending.erased_since_pin), quarantine (append), notifications; each
         commit carries the txn. A re-run after a crash recomputes against the table versions and the
         as-of time pinned in the request log's commit (batch_pin, time travel), so it reaches the same
         decisions and only writes the tables the first attempt did not reach (its tasks write no files
         when the data commit is there; files an attempt wrote but never committed are deleted first).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from engagement_platform.engagement.mutation.activity_commit import Applied, activity_step, files_to_write, log_step
from engagement_platform.engagement.mutation.affected_rows import plan_files
from engagement_platform.engagement.mutation.hold_back import request_order
from engagement_platform.engagement.mutation.on_executors import apply_on_executors
from engagement_platform.engagement.mutation.pending import (
    describe_missing,
    erased_since_pin,
    gather_candidates,
    pending_delta,
    pending_max_age_hours,
    pending_step,
    quarantine_candidates,
    split_held,
)
from engagement_platform.engagement.mutation.request_columns import iso
from engagement_platform.engagement.mutation.suppressed import drop_suppressed_requests
from engagement_platform.engagement.mutation.tables import (
    ENGAGEMENT_MUTATION_REQUESTS,
    ENGAGEMENT_MUTATIONS_PENDING,
    QUARANTINE_ENGAGEMENT_MUTATIONS,
)
from engagement_platform.engagement.mutation.validate import validate_requests
from engagement_platform.engagement.tables import (
    ACTIVITY_LOCK,
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_ERASED_SUBJECTS,
    ENGAGEMENT_NOTIFICATIONS,
    ENGAGEMENT_SUPPRESSED_RECORDS,
)
from engagement_platform.ingest.errors import ERRORS
from engagement_platform.ingest.pipeline import QuarantineContext, quarantine_rows
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.file_writes import writer_tag
from engagement_platform.lake.suppression_tables import (
    drop_suppressed_quarantine,
    hits_table,
    load_suppressed,
    suppressed_rows,
    suppressed_step,
)
from engagement_platform.settings import load_settings
from engagement_platform.streams.batch import CommitStep, Outcomes, commit_batch, failpoint
from engagement_platform.streams.gc_pause import no_cyclic_gc
from engagement_platform.streams.notify import notification_step
from engagement_platform.streams.pin import Pin, pin_batch
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.spec import BatchContext, StreamSpec, batch_metadata

STREAM = "mutation"
APP_ID = "engagement.mutation"
PIPELINE_NAME = "engagement_mutations"
DEFAULT_HORIZON_BATCHES = 10
TARGET_NOT_FOUND = "target_not_found_within_horizon"
OUTCOMES = pa.array(["applied", "pending", "expired"])  # the request log's outcome, by code
APPLIED, PENDING, EXPIRED = range(3)
DATA_FILES = "data_files"  # the failpoint step after the executors wrote the batch's files


def mutations_topic() -> str:
    """The requests topic (EP_MUTATIONS_TOPIC, default engagement.mutations), read at run time."""
    return load_settings().mutation.topic


def batch_pin(lake: DeltaLake, batch_id: int) -> Pin:
    """The as-of time and the versions of engagement_activity and the pending table this batch computes
    against: pinned in the request log's commit (the batch's first) once it exists, so a re-run reaches
    the same decisions (pending ages, received_at / quarantined_at); before that, now and the current ones."""
    return pin_batch(
        lake,
        ENGAGEMENT_MUTATION_REQUESTS.name,
        APP_ID,
        batch_id,
        [ENGAGEMENT_ACTIVITY.name, ENGAGEMENT_MUTATIONS_PENDING.name],
    )


def pinned_as_of(lake: DeltaLake, batch_id: int) -> datetime:
    """The batch's as-of time (batch_pin)."""
    return batch_pin(lake, batch_id).as_of


@dataclass
class MutationResult:
    plan: BatchPlan
    requests_read: int
    requests_valid: int
    requests_malformed: int
    requests_suppressed: int  # naming an erased subject: dropped, stored nowhere
    requests_in: int  # valid new + pending retried
    requests_applied: int
    actions: int  # owner + engagement actions after reduction
    rows_scanned: int
    rows_updated: int
    rows_replaced: int
    rows_deleted: int
    files_read: int
    files_total: int
    commit_how: str  # files | merge | none | earlier (activity_commit.Applied)
    commit_metrics: dict
    pending_added: int
    pending_resolved: int
    pending_retained: int
    pending_expired: int
    quarantined_errors: int
    versions: Outcomes
    snapshot: dict[str, int]  # table -> the version the batch computed against (batch_pin)
    org_ids: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def reduction_ratio(self) -> float:
        return round(self.requests_applied / max(self.actions, 1), 3)

    def metadata(self) -> dict:
        return batch_metadata(
            self.plan,
            self.versions,
            self.seconds,
            requests_read=self.requests_read,
            requests_valid=self.requests_valid,
            requests_malformed=self.requests_malformed,
            requests_suppressed=self.requests_suppressed,
            requests_in=self.requests_in,
            requests_applied=self.requests_applied,
            actions_after_reduction=self.actions,
            reduction_ratio=self.reduction_ratio,
            rows_scanned=self.rows_scanned,
            rows_updated=self.rows_updated,
            rows_replaced=self.rows_replaced,
            rows_deleted=self.rows_deleted,
            files_read=self.files_read,
            files_total=self.files_total,
            activity_commit=self.commit_how,
            **{f"commit_{k}": v for k, v in self.commit_metrics.items() if isinstance(v, (int, float))},
            pending_added=self.pending_added,
            pending_resolved=self.pending_resolved,
            pending_retained=self.pending_retained,
            pending_expired=self.pending_expired,
            quarantined_errors=self.quarantined_errors,
            org_ids=",".join(self.org_ids),
        )


@no_cyclic_gc()  # per-request dicts and candidates: millions of small objects in a large batch
def apply_mutation_batch(
    spark: SparkSession,
    lake: DeltaLake,
    checkpoints: CheckpointStore,
    bootstrap_servers: str,
    plan: BatchPlan,
    horizon_batches: int = DEFAULT_HORIZON_BATCHES,
    kafka_config: dict | None = None,
    max_age_hours: float | None = None,
) -> MutationResult:
    seconds: dict[str, float] = {}
    batch = plan.batch_id
    t0 = time.perf_counter()
    validated, checked = validate_requests(spark, bootstrap_servers, plan, kafka_config, seconds)
    seconds["read_validate"] = time.perf_counter() - t0
    max_age_hours = pending_max_age_hours() if max_age_hours is None else max_age_hours
    pin = batch_pin(lake, batch)
    as_of = now = pin.as_of
    activity_version, pending_version = (
        pin.versions[ENGAGEMENT_ACTIVITY.name],
        pin.versions[ENGAGEMENT_MUTATIONS_PENDING.name],
    )

    # -- requests of this batch: new valid ones + every pending one (pinned version), one row each
    t1 = time.perf_counter()
    context = QuarantineContext(PIPELINE_NAME, batch, plan.topic, now, kafka=True)
    n_errors = pc.list_value_length(validated[ERRORS])
    # requests naming an erased subject are dropped and only counted: the latest list, not the pinned one (an
    # erasure between a crashed attempt and this re-run must hold for every step not committed yet)
    suppressed = load_suppressed(lake, ENGAGEMENT_ERASED_SUBJECTS, load_settings().erasure.secret)
    checked, request_hits = drop_suppressed_requests(checked, suppressed)
    malformed, malformed_hits = drop_suppressed_quarantine(
        quarantine_rows(validated.filter(pc.greater(n_errors, 0)), context), suppressed
    )
    hits = hits_table(request_hits + malformed_hits)
    gathered = gather_candidates(lake, pending_version, checked, batch, horizon_batches)
    candidates = gathered.table
    order = request_order(candidates)
    seq = np.empty(len(order), dtype=np.int64)
    seq[order] = np.arange(len(order))
    orgs = sorted(pc.unique(candidates["org_id"]).to_pylist())
    seconds["prepare"] = time.perf_counter() - t1

    # -- the executors: per org, hold-back, exact fold, row outcomes and the rewrite of the touched files
    t2 = time.perf_counter()
    files = plan_files(lake, ENGAGEMENT_ACTIVITY.name, activity_version, candidates)
    tag = writer_tag(APP_ID, batch)
    write, log_version = files_to_write(lake, APP_ID, batch, tag)
    executed = apply_on_executors(spark, lake, candidates, files, tag, write, log_version, seconds)
    failpoint(STREAM, DATA_FILES)  # the executors' files are written, nothing is committed
    held_back, active = executed.held_back, executed.held_back.active
    seconds["executors"] = time.perf_counter() - t2
    seconds.update(
        {k[:-3] + "_s": executed.stats[k] / 1000 for k in executed.stats if k.endswith("_ms")}
    )  # summed over tasks
    t4 = time.perf_counter()
    expired, still_pending = split_held(candidates, held_back, batch, as_of, max_age_hours)
    outcome = np.full(candidates.num_rows, APPLIED, dtype=np.int64)
    outcome[[c["index"] for c in still_pending]] = PENDING
    outcome[[c["index"] for c in expired]] = EXPIRED
    # A re-run computes against its pin but does not write back what an erasure deleted after the pin.
    erased = erased_since_pin(lake, APP_ID, batch, pending_version, gathered.new)
    seconds["outcomes"] = time.perf_counter() - t4

    t5 = time.perf_counter()
    log_rows = _log_rows(gathered.new, outcome[gathered.carried.num_rows :], plan, now)
    delta = pending_delta(still_pending, erased, gathered.carried, seq, batch, as_of)
    quarantine = pa.concat_tables(
        [
            malformed,
            quarantine_candidates(
                gathered.arrived.filter(pa.array(gathered.replayed)).to_pylist(),
                context,
                STREAM,
                "duplicate_request",
                lambda c: f"request_id '{c['request_id']}' was already received by an earlier batch",
            ),
            quarantine_candidates(
                [c for c in expired if (c["org_id"], c["request_id"]) not in erased],
                context,
                STREAM,
                TARGET_NOT_FOUND,
                lambda c: (
                    f"targets {describe_missing(c['missing'])} not found in engagement_activity within the "
                    f"{' and '.join(c['horizons'])} horizon: "
                    f"{horizon_batches} batch(es) after batch {c['first_seen_batch']} ({c['attempts'] + 1} attempts), "
                    f"{max_age_hours:g} h after {iso(c['first_seen_at'] or as_of)} (batch as-of {iso(as_of)})"
                ),
            ),
        ]
    )
    applied = Applied()
    seconds["log_rows"] = time.perf_counter() - t5

    t6 = time.perf_counter()
    versions = commit_batch(
        plan,
        APP_ID,
        [
            CommitStep(
                ENGAGEMENT_MUTATION_REQUESTS.name,
                lambda txn, _: lake.append(ENGAGEMENT_MUTATION_REQUESTS, log_rows, txn),
            ),
            activity_step(lake, APP_ID, batch, tag, executed, activity_version, applied, seconds),
            log_step(lake, APP_ID, batch, executed, log_version),
            pending_step(lake, delta),
            CommitStep(
                QUARANTINE_ENGAGEMENT_MUTATIONS.name,
                lambda txn, _: lake.append(QUARANTINE_ENGAGEMENT_MUTATIONS, quarantine, txn),
            ),
            suppressed_step(
                lake,
                ENGAGEMENT_SUPPRESSED_RECORDS,
                suppressed_rows(ENGAGEMENT_SUPPRESSED_RECORDS, hits, STREAM, batch, now),
            ),
            # counts as the activity step found them (filled when it commits); a re-run reads them back
            notification_step(
                lake,
                ENGAGEMENT_NOTIFICATIONS,
                ENGAGEMENT_ACTIVITY.name,
                APP_ID,
                plan,
                now,
                appended_counts=applied.counts,
            ),
        ],
        checkpoints,
        ranges=plan.ranges_json(),
        **pin.metadata(),  # in every commit's metadata; the request log's is read back by a re-run (batch_pin)
    )
    seconds["commits"] = time.perf_counter() - t6
    from_pending = np.asarray(candidates["from_pending"].to_numpy(zero_copy_only=False), dtype=bool)
    return MutationResult(
        plan=plan,
        requests_read=validated.num_rows,
        requests_valid=gathered.arrived.num_rows,
        requests_malformed=validated.num_rows - gathered.arrived.num_rows - hits.num_rows,
        requests_suppressed=hits.num_rows,
        requests_in=candidates.num_rows,
        requests_applied=int(active.sum()),
        actions=executed.stats["actions"],
        rows_scanned=executed.stats["rows_scanned"],
        rows_updated=executed.stats["updated"],
        rows_replaced=executed.stats["replaced"],
        rows_deleted=executed.stats["deleted"],
        files_read=files.files_read,
        files_total=files.files_total,
        commit_how=applied.how,
        commit_metrics=applied.metrics,
        pending_added=sum(1 for c in still_pending if not c["from_pending"]),
        pending_resolved=int((active & from_pending).sum()),
        pending_retained=sum(1 for c in still_pending if c["from_pending"]),
        pending_expired=len(expired),
        quarantined_errors=quarantine.num_rows,
        versions=versions,
        snapshot=pin.versions,
        org_ids=orgs,
        seconds=seconds,
    )


def _log_rows(new: pa.Table, outcome: np.ndarray, plan: BatchPlan, at: datetime) -> pa.Table:
    """The request log's rows of this batch's new requests (candidate rows), with each one's outcome code."""
    n = new.num_rows
    columns = {name: new[name] for name in ENGAGEMENT_MUTATION_REQUESTS.schema.names if name in new.column_names}
    columns.update(
        request_date=pc.cast(new["request_time"], pa.date32()),
        outcome=OUTCOMES.take(pa.array(outcome, pa.int64())),
        batch_id=pa.array([plan.batch_id] * n, pa.int64()),
        received_at=pa.array([at] * n, pa.timestamp("us", tz="UTC")),
    )
    return pa.table({name: columns[name] for name in ENGAGEMENT_MUTATION_REQUESTS.schema.names}).cast(
        ENGAGEMENT_MUTATION_REQUESTS.schema
    )


def run_batch(ctx: BatchContext, plan: BatchPlan) -> MutationResult:
    return apply_mutation_batch(ctx.spark, ctx.lake, ctx.checkpoints, ctx.kafka_servers, plan)


SPEC = StreamSpec(name=STREAM, app_id=APP_ID, run_batch=run_batch, lock_name=ACTIVITY_LOCK)
