"""ID mutation stream: one planned slice of `engagement.mutations` -> one MERGE of engagement_activity,
plus the request log, the pending requests, quarantine and notifications.

Requests: their JSON format is in validate.py.

Lifecycle (streams/batch.py; txn app id `engagement.mutation`, version = batch id, stream `mutation`):

compute  The ingest framework parses and validates the slice (pipeline.yaml: required fields, op and
         owner-field enums, timestamp/date types); what depends on the op, the JSON shapes of
         from_ids/record, date order and duplicate request ids are checked on the driver in the same
         error schema (validate.py, request_columns.check_requests). From there the batch is one Arrow
         table, a row per request (new valid ones plus every pending one, pending.CANDIDATE_SCHEMA):
         every step below is column-wise except the fold, which needs MutationRequest objects. One
         I/O-pruned read of engagement_activity (affected_rows: the orgs' partitions, min/max date
         stats when every request of an org is bounded, whole rows read once, a chunk of files at a
         time, kept by Arrow set lookups of the ids and engagements involved) gives the rows any
         request can touch. Requests whose targets are missing are held back (hold_back, below), the
         rest of each org is reduced once with the exact fold (reduction/fold.reduce_requests) and
         every row's outcome is computed column-wise (outcome_table).
reducer  Where the fold runs (reducer.py; the hold-back above always runs first, on the driver, so both
         give the same actions table, row for row): EP_MUTATION_REDUCER=spark (spark_reducer.reduce_to_arrow:
         one Spark job, repartitioned and grouped by org, applyInArrow runs the fold per org on the
         Python workers), driver (the fold per org in this process) or auto (default): Spark when more
         than EP_MUTATION_SPARK_THRESHOLD requests are left to reduce, else the driver. Why that
         default: on a small machine (2 cores, Spark local[2]) the driver fold won at every batch size
         measured (BENCHMARKS.md), as the Spark job pays a fixed cost per batch and, per request, an
         upload, a shuffle, Arrow <-> object conversions in the workers and a collect, more than the
         driver's fold of the same request. There is no crossover to pick, so auto keeps batches of the
         default plan bound on the driver and sends only much larger ones to the grouped Spark job,
         whose fold work spreads over executors. On a real cluster, set the threshold from
         benchmarks/mutation.py, which times both reducers on the same requests.
pending  A request whose external target (fold.external_targets: an id or engagement no earlier
         request of the batch produced) has no row in the table within the request's date range is
         held back whole, and the org's targets are looked up again without it until none is missing (a
         request that needed what a held-back request would have produced is then held back too, so a
         chain keeps its order). Held-back requests go to the pending table and are retried in each of
         the next `horizon_batches` batches, for at most EP_MUTATION_PENDING_MAX_AGE_HOURS after the batch
         that first held them back (both measured at the batch's pinned as-of time); then they are
         quarantined with `target_not_found_within_horizon`, the message naming the horizon that ran out.
commit   request log (append), engagement_activity (ONE delta-rs MERGE), pending (one MERGE: upsert kept,
         delete consumed; requests an erasure deleted after the pin are not written back,
         pending.erased_since_pin), quarantine (append), notifications (counts from the MERGE commit's
         change data feed); each commit carries the txn. A re-run after a crash recomputes against the
         table versions and the as-of time pinned in the request log's commit (batch_pin, time travel),
         so it reaches the same decisions and only writes the tables the first attempt did not reach.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from engagement_platform.engagement.mutation.affected_rows import read_affected
from engagement_platform.engagement.mutation.hold_back import affected_keys, hold_back, request_order, request_targets
from engagement_platform.engagement.mutation.outcome_table import ACTION, DELETE, UPDATE, outcome_table
from engagement_platform.engagement.mutation.pending import (
    describe_missing, erased_since_pin, gather_candidates, pending_delta, pending_max_age_hours, pending_step, quarantine_candidates, split_held,
)
from engagement_platform.engagement.mutation.reducer import REDUCER, reduce_batch
from engagement_platform.engagement.mutation.request_columns import iso, mutation_requests
from engagement_platform.engagement.mutation.tables import (
    ENGAGEMENT_MUTATION_REQUESTS, ENGAGEMENT_MUTATIONS_PENDING, QUARANTINE_ENGAGEMENT_MUTATIONS,
)
from engagement_platform.engagement.mutation.validate import validate_requests
from engagement_platform.engagement.tables import ACTIVITY_LOCK, ENGAGEMENT_ACTIVITY, ENGAGEMENT_NOTIFICATIONS
from engagement_platform.ingest.errors import ERRORS
from engagement_platform.ingest.pipeline import QuarantineContext, quarantine_rows
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake, sql_literal
from engagement_platform.settings import load_settings
from engagement_platform.streams.batch import CommitStep, Outcomes, commit_batch
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
MERGE_KEYS = ("num_source_rows", "num_target_rows_updated", "num_target_rows_deleted", "num_target_rows_copied",
              "num_target_files_scanned", "num_target_files_skipped_during_scan", "num_target_files_added", "num_target_files_removed")


def mutations_topic() -> str:
    """The requests topic (EP_MUTATIONS_TOPIC, default engagement.mutations), read at run time."""
    return load_settings().mutation.topic


def batch_pin(lake: DeltaLake, batch_id: int) -> Pin:
    """The as-of time and the versions of engagement_activity and the pending table this batch computes
    against: pinned in the request log's commit (the batch's first) once it exists, so a re-run reaches
    the same decisions (pending ages, received_at / quarantined_at); before that, now and the current ones."""
    return pin_batch(lake, ENGAGEMENT_MUTATION_REQUESTS.name, APP_ID, batch_id, [ENGAGEMENT_ACTIVITY.name, ENGAGEMENT_MUTATIONS_PENDING.name])


def pinned_as_of(lake: DeltaLake, batch_id: int) -> datetime:
    """The batch's as-of time (batch_pin)."""
    return batch_pin(lake, batch_id).as_of


@dataclass
class MutationResult:
    plan: BatchPlan
    requests_read: int
    requests_valid: int
    requests_malformed: int
    requests_in: int  # valid new + pending retried
    requests_applied: int
    actions: int  # owner + engagement actions after reduction
    rows_scanned: int
    rows_updated: int
    rows_replaced: int
    rows_deleted: int
    files_read: int
    files_total: int
    merge_metrics: dict
    pending_added: int
    pending_resolved: int
    pending_retained: int
    pending_expired: int
    quarantined_errors: int
    versions: Outcomes
    snapshot: dict[str, int]  # table -> the version the batch computed against (batch_pin)
    org_ids: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    reducer: str = REDUCER

    @property
    def reduction_ratio(self) -> float:
        return round(self.requests_applied / max(self.actions, 1), 3)

    def metadata(self) -> dict:
        return batch_metadata(
            self.plan, self.versions, self.seconds,
            requests_read=self.requests_read,
            requests_valid=self.requests_valid,
            requests_malformed=self.requests_malformed,
            requests_in=self.requests_in,
            requests_applied=self.requests_applied,
            actions_after_reduction=self.actions,
            reduction_ratio=self.reduction_ratio,
            reducer=self.reducer,
            rows_scanned=self.rows_scanned,
            rows_updated=self.rows_updated,
            rows_replaced=self.rows_replaced,
            rows_deleted=self.rows_deleted,
            files_read=self.files_read,
            files_total=self.files_total,
            **{f"merge_{k}": self.merge_metrics.get(k) for k in MERGE_KEYS if k in self.merge_metrics},
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
    validated, checked = validate_requests(spark, bootstrap_servers, plan, kafka_config)
    seconds["read_validate"] = time.perf_counter() - t0
    max_age_hours = pending_max_age_hours() if max_age_hours is None else max_age_hours
    pin = batch_pin(lake, batch)
    as_of = now = pin.as_of
    activity_version, pending_version = pin.versions[ENGAGEMENT_ACTIVITY.name], pin.versions[ENGAGEMENT_MUTATIONS_PENDING.name]

    # -- requests of this batch: new valid ones + every pending one (pinned version), one row each
    t1 = time.perf_counter()
    context = QuarantineContext(PIPELINE_NAME, batch, plan.topic, now, kafka=True)
    n_errors = pc.list_value_length(validated[ERRORS])
    malformed = quarantine_rows(validated.filter(pc.greater(n_errors, 0)), context)
    gathered = gather_candidates(lake, pending_version, checked, batch, horizon_batches)
    candidates, records = gathered.table, gathered.records
    order = request_order(candidates)
    seq = np.empty(len(order), dtype=np.int64)
    seq[order] = np.arange(len(order))
    needs, produces = request_targets(candidates, records)
    org_of = candidates["org_id"].to_pylist()
    orgs = sorted(set(org_of))
    seconds["prepare"] = time.perf_counter() - t1

    # -- one pruned read of every row a request of the batch may touch
    t2 = time.perf_counter()
    affected, files_read, files_total = read_affected(
        lake, ENGAGEMENT_ACTIVITY.name, activity_version, ENGAGEMENT_ACTIVITY.schema, candidates, affected_keys(candidates, needs, produces),
    )
    seconds["read_targets"] = time.perf_counter() - t2

    # -- hold back requests whose targets are missing, reduce per org, outcome of every row at once
    t3 = time.perf_counter()
    held_back = hold_back(candidates, needs, produces, seq, affected)
    active = held_back.active
    seconds["hold_back"] = time.perf_counter() - t3
    t3 = time.perf_counter()
    reduced = reduce_batch(mutation_requests(candidates, records), order, org_of, active, spark)
    seconds["reduce"] = time.perf_counter() - t3
    t4 = time.perf_counter()
    source, counts = outcome_table(affected, reduced.actions)
    merge_orgs = pc.unique(source["org_id"]).to_pylist()
    expired, still_pending = split_held(candidates, held_back, batch, as_of, max_age_hours)
    outcome = np.full(candidates.num_rows, APPLIED, dtype=np.int64)
    outcome[[c["index"] for c in still_pending]] = PENDING
    outcome[[c["index"] for c in expired]] = EXPIRED
    # A re-run computes against its pin but does not write back what an erasure deleted after the pin.
    erased = erased_since_pin(lake, APP_ID, batch, pending_version, gathered.new)
    seconds["outcomes"] = time.perf_counter() - t4

    t5 = time.perf_counter()
    log_rows = _log_rows(gathered.new, outcome[gathered.carried.num_rows:], plan, now)
    delta = pending_delta(still_pending, erased, gathered.carried, seq, batch, as_of)
    quarantine = pa.concat_tables([
        malformed,
        quarantine_candidates(gathered.arrived.filter(pa.array(gathered.replayed)).to_pylist(), context, STREAM, "duplicate_request",
                              lambda c: f"request_id '{c['request_id']}' was already received by an earlier batch"),
        quarantine_candidates([c for c in expired if (c["org_id"], c["request_id"]) not in erased], context, STREAM, TARGET_NOT_FOUND, lambda c: (
            f"targets {describe_missing(c['missing'])} not found in engagement_activity within the "
            f"{' and '.join(c['horizons'])} horizon: "
            f"{horizon_batches} batch(es) after batch {c['first_seen_batch']} ({c['attempts'] + 1} attempts), "
            f"{max_age_hours:g} h after {iso(c['first_seen_at'] or as_of)} (batch as-of {iso(as_of)})")),
    ])
    merge_metrics: dict = {}
    seconds["merge"] = 0.0
    seconds["log_rows"] = time.perf_counter() - t5

    t6 = time.perf_counter()
    versions = commit_batch(
        plan,
        APP_ID,
        [
            CommitStep(ENGAGEMENT_MUTATION_REQUESTS.name, lambda txn, _: lake.append(ENGAGEMENT_MUTATION_REQUESTS, log_rows, txn)),
            _merge_step(lake, batch, source, merge_orgs, merge_metrics, seconds),
            pending_step(lake, delta),
            CommitStep(QUARANTINE_ENGAGEMENT_MUTATIONS.name, lambda txn, _: lake.append(QUARANTINE_ENGAGEMENT_MUTATIONS, quarantine, txn)),
            notification_step(lake, ENGAGEMENT_NOTIFICATIONS, ENGAGEMENT_ACTIVITY.name, APP_ID, plan, now),
        ],
        checkpoints,
        ranges=plan.ranges_json(),
        **pin.metadata(),  # in every commit's metadata; the request log's is read back by a re-run (batch_pin)
    )
    seconds["commits_other"] = time.perf_counter() - t6 - seconds["merge"]
    from_pending = np.asarray(candidates["from_pending"].to_numpy(zero_copy_only=False), dtype=bool)
    return MutationResult(
        plan=plan,
        requests_read=validated.num_rows,
        requests_valid=gathered.arrived.num_rows,
        requests_malformed=validated.num_rows - gathered.arrived.num_rows,
        requests_in=candidates.num_rows,
        requests_applied=int(active.sum()),
        actions=reduced.action_count,
        rows_scanned=affected.num_rows,
        rows_updated=counts["updated"],
        rows_replaced=counts["replaced"],
        rows_deleted=counts["deleted"],
        files_read=files_read,
        files_total=files_total,
        merge_metrics=merge_metrics,
        pending_added=sum(1 for c in still_pending if not c["from_pending"]),
        pending_resolved=int((active & from_pending).sum()),
        pending_retained=sum(1 for c in still_pending if c["from_pending"]),
        pending_expired=len(expired),
        quarantined_errors=quarantine.num_rows,
        versions=versions,
        snapshot=pin.versions,
        org_ids=orgs,
        seconds=seconds,
        reducer=reduced.reducer,
    )


def _merge_step(lake: DeltaLake, batch: int, source: pa.Table, orgs: list[str], merge_metrics: dict, seconds: dict[str, float]) -> CommitStep:
    """engagement_activity's commit: ONE MERGE of the outcome rows (`source`) into the orgs' partitions; its
    metrics (or, on a re-run, the earlier attempt's) go into `merge_metrics`, its time into seconds["merge"]."""

    def commit(txn: BatchTxn, _: Outcomes) -> int | None:
        lake.ensure(ENGAGEMENT_ACTIVITY)
        if lake.already_committed(ENGAGEMENT_ACTIVITY.name, txn):
            info = lake.batch_commit(ENGAGEMENT_ACTIVITY.name, APP_ID, batch) or {}
            merge_metrics.update(info.get("operationMetrics") or {})
            return None
        if source.num_rows == 0:
            return None  # nothing to change: no commit (a re-run finds nothing to do either)
        t = time.perf_counter()
        metrics = (
            lake.merge(ENGAGEMENT_ACTIVITY, source, _merge_predicate(orgs), txn)
            .when_matched_update_all(predicate=f"s.{ACTION} = '{UPDATE}'", except_cols=[ACTION])
            .when_matched_delete(predicate=f"s.{ACTION} = '{DELETE}'")
            .execute()
        )
        merge_metrics.update(metrics)
        seconds["merge"] = time.perf_counter() - t
        return lake.table(ENGAGEMENT_ACTIVITY.name).version()

    return CommitStep(ENGAGEMENT_ACTIVITY.name, commit)


def _log_rows(new: pa.Table, outcome: np.ndarray, plan: BatchPlan, at: datetime) -> pa.Table:
    """The request log's rows of this batch's new requests (candidate rows), with each one's outcome code."""
    n = new.num_rows
    columns = {name: new[name] for name in ENGAGEMENT_MUTATION_REQUESTS.schema.names if name in new.column_names}
    columns.update(request_date=pc.cast(new["request_time"], pa.date32()), outcome=OUTCOMES.take(pa.array(outcome, pa.int64())),
                   batch_id=pa.array([plan.batch_id] * n, pa.int64()), received_at=pa.array([at] * n, pa.timestamp("us", tz="UTC")))
    return pa.table({name: columns[name] for name in ENGAGEMENT_MUTATION_REQUESTS.schema.names}).cast(ENGAGEMENT_MUTATION_REQUESTS.schema)


def _merge_predicate(orgs: list[str]) -> str:
    partitions = ", ".join(sql_literal(o) for o in orgs)
    return f"t.org_id IN ({partitions}) AND t.org_id = s.org_id AND t.engagement_id = s.engagement_id"


def run_batch(ctx: BatchContext, plan: BatchPlan) -> MutationResult:
    return apply_mutation_batch(ctx.spark, ctx.lake, ctx.checkpoints, ctx.kafka_servers, plan)


SPEC = StreamSpec(name=STREAM, app_id=APP_ID, run_batch=run_batch, lock_name=ACTIVITY_LOCK)
