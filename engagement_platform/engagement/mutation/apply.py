"""ID mutation stream (issue 4): one planned slice of `engagement.mutations` -> one MERGE of
engagement_activity, plus the request log, the pending requests, quarantine and notifications.

Requests (JSON, one per Kafka message; keys map onto mutation_request.MutationRequest):

    common   request_id (str), org_id (str), request_time (ISO timestamp), op: convert|merge|delete|update,
             optional date_from / date_to (ISO dates, inclusive): only rows whose engagement_date is in range
    convert  from_field, from_id, to_field, to_id     -> MutationRequest(field=from_field, owner_id=from_id, to_field, to_id)
    merge    field, from_ids ([str, ...]), to_id       -> MutationRequest(field, from_ids, to_id)
    delete   engagement_id                             -> MutationRequest(engagement_id)          (one row)
             or field + id                             -> MutationRequest(field, owner_id=id)     (every row of an owner)
    update   engagement_id, record {column: value}     -> MutationRequest(engagement_id, record)

    Owner fields: lead_id, contact_id, account_id, user_id. An update's record may name any
    engagement_activity column except org_id, engagement_id and the ingestion columns; it replaces
    the owner ids and engagement_date (a missing one becomes null, as in the cascade reference) and
    sets every other column it names; columns it does not name keep their values.

    {"request_id": "r1", "org_id": "00D000001", "request_time": "2026-01-06T10:00:00Z", "op": "convert",
     "from_field": "lead_id", "from_id": "00Q000001", "to_field": "contact_id", "to_id": "003000009"}

Lifecycle (streams/batch.py; txn app id `engagement.mutation`, version = batch id, stream `mutation`):

compute  The ingest framework parses and validates the slice (mutation_pipeline.yaml: required
         fields, op and owner-field enums, timestamp/date types); what depends on the op, the JSON
         shapes of from_ids/record, date order and duplicate request ids are checked on the driver
         in the same error schema (request_columns.check_requests). From there the batch is one Arrow
         table, a row per request (new valid ones plus every pending one, CANDIDATE_SCHEMA): every
         step below is column-wise except the fold, which needs MutationRequest objects. One
         I/O-pruned read of engagement_activity (affected_rows: the orgs' partitions, min/max date
         stats when every request of an org is bounded, whole rows read once, a chunk of files at a
         time, kept by Arrow set lookups of the ids and engagements involved) gives the rows any
         request can touch. Requests whose targets are missing are held back (hold_back, below), the
         rest of each org is reduced once with the exact fold (cascade_fold.reduce_requests) and
         every row's outcome is computed column-wise (outcome_table).
reducer  Where the fold runs (the hold-back above always runs first, on the driver, so both give the
         same actions table, row for row): EP_MUTATION_REDUCER=spark (cascade_spark.reduce_to_arrow:
         one Spark job, repartitioned and grouped by org, applyInArrow runs the fold per org on the
         Python workers), driver (the fold per org in this process) or auto (default): Spark when more
         than EP_MUTATION_SPARK_THRESHOLD requests are left to reduce (default 1,000,000), else the
         driver. Why that default: on this machine (2 cores, Spark local[2]) the driver fold won at
         every size measured (2026-11-22, load 9-28, same requests, equal output): 20k requests 0.6 s
         vs 7.9 s on Spark, 200k 4.3 s vs 20.7 s, 1M 18.1 s vs 47.0 s (Spark ~6 s fixed + ~41 us per
         request: upload, shuffle, Arrow <-> objects in the workers, collect; driver ~18 us). There is
         no crossover to pick, so auto keeps every batch the default plan bound makes (4 partitions x
         250k = 1M requests) on the driver and sends only larger ones, which were not measured, to the
         grouped Spark job, whose fold work spreads over executors. On a real cluster, set the
         threshold from benchmarks/mutation.py, which times both reducers on the same requests.
pending  A request whose external target (cascade_fold.external_targets: an id or engagement no earlier
         request of the batch produced) has no row in the table within the request's date range is
         held back whole, and the org's targets are looked up again without it until none is missing (a
         request that needed what a held-back request would have produced is then held back too, so a
         chain keeps its order). Held-back requests go to the pending table and are retried in each of
         the next `horizon_batches` batches, for at most EP_MUTATION_PENDING_MAX_AGE_HOURS after the batch
         that first held them back (both measured at the batch's pinned as-of time); then they are
         quarantined with `target_not_found_within_horizon`, the message naming the horizon that ran out.
commit   request log (append), engagement_activity (ONE delta-rs MERGE), pending (one MERGE: upsert kept,
         delete consumed; requests an erasure deleted after the pin are not written back, erased_since_pin),
         quarantine (append), notifications (counts from the MERGE commit's change data feed); each
         commit carries the txn. A re-run after a crash recomputes against the table versions pinned
         in the request log's commit (time travel) and its as-of time, so it reaches the same decisions and only writes
         the tables the first attempt did not reach.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from functools import cache
from itertools import groupby
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark.sql import SparkSession

from engagement_platform.engagement.mutation.affected_rows import read_affected
from engagement_platform.engagement.mutation.reduction.fold import reduce_requests
from engagement_platform.engagement.mutation.hold_back import affected_keys, hold_back, request_order, request_targets
from engagement_platform.engagement.ingestion.apply import reject_on_driver
from engagement_platform.engagement.mutation.requests import MutationRequest
from engagement_platform.engagement.mutation.tables import (
    ENGAGEMENT_MUTATION_REQUESTS, ENGAGEMENT_MUTATIONS_PENDING, QUARANTINE_ENGAGEMENT_MUTATIONS,
)
from engagement_platform.engagement.mutation.outcome_table import ACTION, DELETE, UPDATE, outcome_table
from engagement_platform.engagement.mutation.reduction.arrow import REDUCED_ARROW_SCHEMA, reduction_table
from engagement_platform.engagement.mutation.request_columns import (
    CANONICAL_SCHEMA, CheckedRequests, canonical_from_json, check_requests, iso, mutation_requests, parse_timestamp,
    request_json, typed_record,
)
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_NOTIFICATIONS
from engagement_platform.streams.gc_pause import no_cyclic_gc
from engagement_platform.ingest.config import PipelineConfig, load_pipeline
from engagement_platform.ingest.errors import ERRORS, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import Pipeline, QuarantineContext, quarantine_rows
from engagement_platform.ingest.sources import read_kafka
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake, sql_literal
from engagement_platform.lake.notifications import notification_rows
from engagement_platform.lake.quarantine import QUARANTINE_SCHEMA
from engagement_platform.streams.batch import CommitStep, Outcomes, commit_batch
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.settings import load_settings

STREAM = "mutation"
APP_ID = "engagement.mutation"
PIPELINE_NAME = "engagement_mutations"
PIPELINE_FILE = Path(__file__).with_name("pipeline.yaml")
DEFAULT_HORIZON_BATCHES = 10
PENDING_ACTION, UPSERT, PENDING_DELETE = "_pending_action", "upsert", "delete"  # the pending step's MERGE source
REDUCER_ENV = "EP_MUTATION_REDUCER"  # spark | driver | auto (module docstring: the default and why)
DEFAULT_REDUCER = "auto"
REDUCER = "driver"  # what MutationResult reports when no reduction ran

APPLY = "apply"  # stage of errors found while applying (targets never arrived)
TARGET_NOT_FOUND = "target_not_found_within_horizon"
OUTCOMES = pa.array(["applied", "pending", "expired"])  # the request log's outcome, by code
APPLIED, PENDING, EXPIRED = range(3)


def pending_max_age_hours() -> float:
    """Hours a request may wait in the pending table (EP_MUTATION_PENDING_MAX_AGE_HOURS, default 72), read at run time."""
    return load_settings().mutation.pending_max_age_hours


def mutations_topic() -> str:
    """The requests topic (EP_MUTATIONS_TOPIC, default engagement.mutations), read at run time."""
    return load_settings().mutation.topic


@cache
def mutation_pipeline(topic: str) -> PipelineConfig:
    config = load_pipeline(PIPELINE_FILE)
    return config.model_copy(update={"source": config.source.model_copy(update={"topic": topic})})


# ---- requests: JSON <-> MutationRequest ----------------------------------------------------------


def request_from_json(d: dict) -> MutationRequest:
    """The canonical request JSON (request_json column) -> cascade.MutationRequest."""
    dates = {k: date.fromisoformat(d[k]) if d.get(k) else None for k in ("date_from", "date_to")}
    rid, org, at, op = d["request_id"], d["org_id"], parse_timestamp(d["request_time"]), d["op"]
    if op == "convert":
        return MutationRequest.convert(rid, org, at, d["from_field"], d["from_id"], d["to_field"], d["to_id"], **dates)
    if op == "merge":
        return MutationRequest.merge(rid, org, at, d["field"], d["from_ids"], d["to_id"], **dates)
    if op == "delete" and d.get("engagement_id"):
        return MutationRequest.delete_engagement(rid, org, at, d["engagement_id"], **dates)
    if op == "delete":
        return MutationRequest.delete_owner(rid, org, at, d["field"], d["id"], **dates)
    if op == "update":
        return MutationRequest.update(rid, org, at, d["engagement_id"], typed_record(d["record"]), **dates)
    raise ValueError(f"unknown op {op!r}")


# ---- compute: read + validate -----------------------------------------------------------------


def validate_requests(spark: SparkSession, bootstrap_servers: str, plan: BatchPlan, kafka_config: dict | None = None) -> tuple[pa.Table, CheckedRequests]:
    """(validated slice with every error in `_errors`, the requests that passed, canonical).

    The framework validates in Spark; the op-dependent checks and duplicate request ids are added here
    (request_columns.check_requests); rows flagged here get their raw bytes back from Kafka."""
    config = mutation_pipeline(plan.topic)
    parsed = read_kafka(spark, config.source, bootstrap_servers, plan.topic, plan.ranges_json(), kafka_config)
    validated = Pipeline.from_config(config).transform(parsed).toArrow()
    validated = validated.sort_by([(SOURCE_PARTITION, "ascending"), (SOURCE_OFFSET, "ascending")])
    checked = check_requests(validated)
    if checked.errors:
        errors = validated[ERRORS].to_pylist()
        for i, found in checked.errors.items():
            errors[i] = found
        validated = reject_on_driver(validated, errors, sorted(checked.errors), bootstrap_servers, plan.topic, kafka_config)
    return validated, checked


# ---- compute: requests -> outcome rows ------------------------------------------------------------

# The batch's requests, one row each: canonical columns, then where they come from and how long they may wait.
CANDIDATE_SCHEMA = pa.schema([
    *CANONICAL_SCHEMA,
    ("source_partition", pa.int32()), ("source_offset", pa.int64()), ("first_seen_batch", pa.int64()), ("attempts", pa.int64()),
    ("expires_batch", pa.int64()), ("from_pending", pa.bool_()),
    ("first_seen_at", pa.timestamp("us", tz="UTC")),  # the as-of time of the batch that first held it back (null: this batch)
    ("request_json", pa.string()),
])


@dataclass
class BatchReduction:
    """Every org's reduced actions (reduction_arrow rows) and how many actions there are."""

    actions: pa.Table
    action_count: int
    reducer: str = REDUCER


def read_at(lake: DeltaLake, name: str, version: int, filter: ds.Expression | None = None, schema: pa.Schema | None = None) -> tuple[pa.Table, int, int]:
    """(rows, files read, files in the table) of `name` at `version` (-1: not created yet)."""
    if version < 0:
        return schema.empty_table(), 0, 0
    dataset = lake.table(name, version).to_pyarrow_dataset()
    total = len(dataset.files)
    if filter is None:
        return dataset.to_table(), total, total
    fragments = list(dataset.get_fragments(filter=filter))
    return dataset.to_table(filter=filter), len(fragments), total


def mutation_reducer(requests: int) -> str:
    """'spark' or 'driver' for a batch reducing `requests` requests (EP_MUTATION_REDUCER, EP_MUTATION_SPARK_THRESHOLD)."""
    settings = load_settings().mutation
    choice = settings.reducer
    if choice not in ("spark", "driver", "auto"):
        raise ValueError(f"{REDUCER_ENV}={choice!r}: expected spark, driver or auto")
    if choice == "auto":
        return "spark" if requests > settings.spark_threshold else "driver"
    return choice


def reduce_batch(requests: list[MutationRequest], order: np.ndarray, orgs: list[str], active: np.ndarray,
                 spark: SparkSession | None = None) -> BatchReduction:
    """Reduce each org's active requests once (`order`: fold order, `orgs`: each request's org):
    on Spark grouped by org (cascade_spark.reduce_to_arrow) or on the driver, per mutation_reducer."""
    applied = order[active[order]].tolist()
    if spark is not None and applied and mutation_reducer(len(applied)) == "spark":
        from engagement_platform.engagement.mutation.reduction.spark_reducer import reduce_to_arrow

        actions = reduce_to_arrow(spark, [requests[i] for i in applied])
        stats = actions.filter(pc.equal(actions["kind"], "stats"))
        count = sum(pc.sum(stats[name]).as_py() or 0 for name in ("owner_actions", "engagement_actions"))
        return BatchReduction(actions, count, reducer="spark")
    tables, count = [], 0
    for org, indices in groupby(applied, key=orgs.__getitem__):
        reduction = reduce_requests([requests[i] for i in indices])
        tables.append(reduction_table(org, reduction, with_external_targets=False))
        count += reduction.stats.actions_out
    actions = pa.concat_tables(tables) if tables else REDUCED_ARROW_SCHEMA.empty_table()
    return BatchReduction(actions, count)


# ---- the batch ---------------------------------------------------------------------------------


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
    snapshot: dict[str, int]
    org_ids: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    reducer: str = REDUCER

    @property
    def reduction_ratio(self) -> float:
        return round(self.requests_applied / max(self.actions, 1), 3)

    def metadata(self) -> dict:
        merge_keys = ("num_source_rows", "num_target_rows_updated", "num_target_rows_deleted", "num_target_rows_copied",
                      "num_target_files_scanned", "num_target_files_skipped_during_scan", "num_target_files_added", "num_target_files_removed")
        return {
            "batch_id": self.plan.batch_id,
            "offset_ranges": self.plan.ranges_json(),
            "requests_read": self.requests_read,
            "requests_valid": self.requests_valid,
            "requests_malformed": self.requests_malformed,
            "requests_in": self.requests_in,
            "requests_applied": self.requests_applied,
            "actions_after_reduction": self.actions,
            "reduction_ratio": self.reduction_ratio,
            "reducer": self.reducer,
            "rows_scanned": self.rows_scanned,
            "rows_updated": self.rows_updated,
            "rows_replaced": self.rows_replaced,
            "rows_deleted": self.rows_deleted,
            "files_read": self.files_read,
            "files_total": self.files_total,
            **{f"merge_{k}": self.merge_metrics.get(k) for k in merge_keys if k in self.merge_metrics},
            "pending_added": self.pending_added,
            "pending_resolved": self.pending_resolved,
            "pending_retained": self.pending_retained,
            "pending_expired": self.pending_expired,
            "quarantined_errors": self.quarantined_errors,
            "org_ids": ",".join(self.org_ids),
            **{f"{k}_version": v for k, v in self.versions.items()},
            **{f"seconds_{k}": round(v, 3) for k, v in self.seconds.items()},
        }


def _current_version(lake: DeltaLake, name: str) -> int:
    return lake.table(name).version() if lake.exists(name) else -1


def snapshot_versions(lake: DeltaLake, batch_id: int) -> dict[str, int]:
    """Versions of engagement_activity and the pending table this batch computes against: pinned in
    the request log's commit once that commit exists, so a re-run reaches the same decisions."""
    info = lake.batch_commit(ENGAGEMENT_MUTATION_REQUESTS.name, APP_ID, batch_id)
    if info is not None and "activity_version" in info:
        return {"activity_version": int(info["activity_version"]), "pending_version": int(info["pending_version"])}
    return {"activity_version": _current_version(lake, ENGAGEMENT_ACTIVITY.name),
            "pending_version": _current_version(lake, ENGAGEMENT_MUTATIONS_PENDING.name)}


def _carried(pending: pa.Table) -> tuple[pa.Table, list[dict | None]]:
    """The pending table's requests as candidate rows (CANDIDATE_SCHEMA) and their typed records."""
    texts = pending["request_json"].to_pylist()
    canonical, records = canonical_from_json(texts)
    columns = {name: canonical[name] for name in CANONICAL_SCHEMA.names}
    columns.update({name: pending[name] for name in ("source_partition", "source_offset", "first_seen_batch", "attempts", "expires_batch")})
    columns["from_pending"] = pa.array([True] * pending.num_rows, pa.bool_())
    # null in rows written before the column existed: the clock starts now
    columns["first_seen_at"] = pending["first_seen_at"] if "first_seen_at" in pending.column_names else pa.nulls(pending.num_rows, pa.timestamp("us", tz="UTC"))
    columns["request_json"] = pending["request_json"]
    return pa.table(columns).cast(CANDIDATE_SCHEMA), records


def _new_candidates(checked: pa.Table, batch_id: int, horizon_batches: int) -> pa.Table:
    """The slice's checked requests as candidate rows: first seen in this batch."""
    n = checked.num_rows
    columns = {name: checked[name] for name in CANONICAL_SCHEMA.names}
    columns.update(source_partition=checked[SOURCE_PARTITION], source_offset=checked[SOURCE_OFFSET],
                   first_seen_batch=pa.array([batch_id] * n, pa.int64()), attempts=pa.array([0] * n, pa.int64()),
                   expires_batch=pa.array([batch_id + horizon_batches] * n, pa.int64()), from_pending=pa.array([False] * n, pa.bool_()),
                   first_seen_at=pa.nulls(n, pa.timestamp("us", tz="UTC")), request_json=request_json(checked))
    return pa.table(columns).cast(CANDIDATE_SCHEMA)


def pinned_as_of(lake: DeltaLake, batch_id: int) -> datetime:
    """The batch's as-of time: pinned in the request log's commit once it exists, so a re-run decides the same
    (pending age, received_at / quarantined_at); before that, now."""
    info = lake.batch_commit(ENGAGEMENT_MUTATION_REQUESTS.name, APP_ID, batch_id)
    if info is not None and "as_of" in info:
        return datetime.fromisoformat(info["as_of"])
    return datetime.now(timezone.utc)


def _expired_horizons(c: dict, batch_id: int, as_of: datetime, max_age: timedelta) -> list[str]:
    """Which horizons a held-back request (a candidate row) has run out of at this batch: "batches" and/or "age" (empty: it waits)."""
    out = []
    if batch_id >= c["expires_batch"]:
        out.append("batches")
    if as_of - (c["first_seen_at"] or as_of) >= max_age:
        out.append("age")
    return out


def _keys(table: pa.Table) -> pa.ChunkedArray:
    """org_id and request_id joined: one string per request, for set lookups."""
    return pc.binary_join_element_wise(table["org_id"], table["request_id"], "\x1f")


def _already_logged(lake: DeltaLake, version_of_log: int, requests: pa.Table, batch_id: int) -> pa.Array:
    """Keys (_keys) of these requests that an earlier batch already logged (a producer retry)."""
    if version_of_log < 0 or requests.num_rows == 0:
        return pa.array([], pa.string())
    orgs = pc.unique(requests["org_id"]).to_pylist()
    # request_id is compared through a cast: files a delta-rs delete/merge rewrote (an erasure) store it as
    # string_view, and pyarrow cannot compare their min/max guarantee with a string literal.
    ids = pc.field("request_id").cast(pa.string()).isin(pc.unique(requests["request_id"]).to_pylist())
    expr = ds.field("org_id").isin(orgs) & ids & (ds.field("batch_id") < batch_id)
    rows, _, _ = read_at(lake, ENGAGEMENT_MUTATION_REQUESTS.name, version_of_log, expr)
    return pc.unique(_keys(rows.select(["org_id", "request_id"]).cast(pa.schema([("org_id", pa.string()), ("request_id", pa.string())]))))


def _request_keys(lake: DeltaLake, name: str, version: int, filter: ds.Expression | None = None) -> set[tuple[str, str]]:
    if version < 0:
        return set()
    rows = lake.table(name, version).to_pyarrow_dataset().to_table(columns=["org_id", "request_id"], filter=filter)
    return set(zip(rows["org_id"].to_pylist(), rows["request_id"].to_pylist()))


def erased_since_pin(lake: DeltaLake, batch_id: int, pinned_pending: int, new: pa.Table) -> set[tuple[str, str]]:
    """(org_id, request_id) of this batch's requests that another writer (a GDPR erasure) deleted after the
    batch's pin; a re-run must not write them back (to pending or quarantine) although its decisions,
    computed against the pin, still count them. The rule: the pending table changes only through this
    stream's one commit per batch and erasure deletes, so every key a commit of another app removed from
    it after the pinned version was erased (optimize/vacuum commits remove no key); and the request log
    is append-only apart from erasures, so a request this batch already logged whose row is gone was erased."""
    erased: set[tuple[str, str]] = set()
    name = ENGAGEMENT_MUTATIONS_PENDING.name
    current = _current_version(lake, name)
    if current > pinned_pending >= 0:
        for commit in lake.table(name).history(limit=current - pinned_pending):
            version = int(commit["version"])
            if version > pinned_pending and commit.get("app_id") != APP_ID:
                erased |= _request_keys(lake, name, version - 1) - _request_keys(lake, name, version)
    log = ENGAGEMENT_MUTATION_REQUESTS.name
    if new.num_rows and lake.exists(log) and (lake.committed_version(log, APP_ID) or -1) >= batch_id:
        new_keys = set(zip(new["org_id"].to_pylist(), new["request_id"].to_pylist()))
        mine = ds.field("org_id").isin(sorted({o for o, _ in new_keys})) & (ds.field("batch_id") == batch_id)
        erased |= new_keys - _request_keys(lake, log, _current_version(lake, log), mine)
    return erased


def _quarantine_candidates(candidates: list[dict], plan: BatchPlan, at: datetime, code: str, message) -> pa.Table:
    """Quarantine rows for candidate rows (dicts of CANDIDATE_SCHEMA, `missing` added for held-back ones)."""
    rows = []
    for c in candidates:
        text, missing = c["request_json"], c.get("missing")
        rows.append(dict(
            pipeline=PIPELINE_NAME, batch_id=plan.batch_id, row_id=f"{plan.topic}:{c['source_partition']}:{c['source_offset']}", source=plan.topic,
            source_partition=c["source_partition"], source_offset=c["source_offset"], org_id=c["org_id"], raw=text.encode(), input=text,
            stage=APPLY, plugin=STREAM, column_name=None, error_code=code, message=message(c), value=json.dumps(missing) if missing else None,
            quarantined_at=at, quarantine_date=at.date(),
        ))
    return pa.Table.from_pylist(rows, schema=QUARANTINE_SCHEMA)


def _describe_missing(missing: list[dict]) -> str:
    return ", ".join(f"{m['field'] or 'engagement_id'}={m['id']}" for m in missing)


def _merge_predicate(orgs: list[str]) -> str:
    partitions = ", ".join(sql_literal(o) for o in orgs)
    return f"t.org_id IN ({partitions}) AND t.org_id = s.org_id AND t.engagement_id = s.engagement_id"


@no_cyclic_gc()  # per-request dicts and candidates: millions of small objects in a 1M batch
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
    as_of = now = pinned_as_of(lake, batch)

    # -- requests of this batch: new valid ones + every pending one (pinned snapshot), one row each
    t1 = time.perf_counter()
    snapshot = snapshot_versions(lake, batch)
    log_version = _current_version(lake, ENGAGEMENT_MUTATION_REQUESTS.name)
    n_errors = pc.list_value_length(validated[ERRORS])
    malformed = quarantine_rows(validated.filter(pc.greater(n_errors, 0)), QuarantineContext(PIPELINE_NAME, batch, plan.topic, now, kafka=True))
    pending_rows, _, _ = read_at(lake, ENGAGEMENT_MUTATIONS_PENDING.name, snapshot["pending_version"], schema=ENGAGEMENT_MUTATIONS_PENDING.schema)
    carried, carried_records = _carried(pending_rows)
    arrived = _new_candidates(checked.requests, batch, horizon_batches)
    seen = pa.concat_arrays([_already_logged(lake, log_version, arrived, batch), pc.unique(_keys(carried)).cast(pa.string())])
    replayed = np.asarray(pc.is_in(_keys(arrived), value_set=seen).to_numpy(zero_copy_only=False), dtype=bool)
    new = arrived.filter(pa.array(~replayed))
    candidates = pa.concat_tables([carried, new])
    records = carried_records + [r for r, again in zip(checked.records, replayed.tolist()) if not again]
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
        lake, ENGAGEMENT_ACTIVITY.name, snapshot["activity_version"], ENGAGEMENT_ACTIVITY.schema, candidates,
        affected_keys(candidates, needs, produces),
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
    # Expiry: `horizon_batches` batches after the first attempt, or `max_age_hours` after the batch that first
    # held it back (first_seen_at), both measured at this batch's pinned as-of time, never the clock at re-run.
    max_age = timedelta(hours=max_age_hours)
    held = candidates.take(pa.array(held_back.held, pa.int64())).to_pylist()
    for index, c in zip(held_back.held, held):
        c["index"], c["missing"] = index, held_back.missing[index]
        c["horizons"] = _expired_horizons(c, batch, as_of, max_age)
    expired = [c for c in held if c["horizons"]]
    still_pending = [c for c in held if not c["horizons"]]
    outcome = np.full(candidates.num_rows, APPLIED, dtype=np.int64)
    outcome[[c["index"] for c in still_pending]] = PENDING
    outcome[[c["index"] for c in expired]] = EXPIRED
    # A re-run computes against its pin but does not write back what an erasure deleted after the pin.
    erased = erased_since_pin(lake, batch, snapshot["pending_version"], new)
    seconds["outcomes"] = time.perf_counter() - t4

    t5 = time.perf_counter()
    log_rows = _log_rows(new, outcome[carried.num_rows:], plan, now)
    keep = sorted((c for c in still_pending if (c["org_id"], c["request_id"]) not in erased), key=lambda c: seq[c["index"]])
    kept_keys = {(c["org_id"], c["request_id"]) for c in keep}
    consumed = sorted(set(zip(carried["org_id"].to_pylist(), carried["request_id"].to_pylist())) - kept_keys)
    pending_table = pa.Table.from_pylist([
        dict(org_id=c["org_id"], request_id=c["request_id"], request_time=c["request_time"], request_json=c["request_json"],
             missing_targets=json.dumps(c["missing"]), first_seen_batch=c["first_seen_batch"], last_batch=batch, attempts=c["attempts"] + 1,
             expires_batch=c["expires_batch"], source_partition=c["source_partition"], source_offset=c["source_offset"],
             first_seen_at=c["first_seen_at"] or as_of)
        for c in keep
    ], schema=ENGAGEMENT_MUTATIONS_PENDING.schema)
    # The pending step's change as a delta against the current table: upsert what stays, delete what it consumed.
    pending_delta = pa.concat_tables([
        pending_table.append_column(PENDING_ACTION, pa.array([UPSERT] * pending_table.num_rows, pa.string())),
        pa.Table.from_pylist([dict(org_id=o, request_id=r, **{PENDING_ACTION: PENDING_DELETE}) for o, r in consumed],
                             schema=ENGAGEMENT_MUTATIONS_PENDING.schema.append(pa.field(PENDING_ACTION, pa.string()))),
    ])
    quarantine = pa.concat_tables([
        malformed,
        _quarantine_candidates(arrived.filter(pa.array(replayed)).to_pylist(), plan, now, "duplicate_request",
                               lambda c: f"request_id '{c['request_id']}' was already received by an earlier batch"),
        _quarantine_candidates([c for c in expired if (c["org_id"], c["request_id"]) not in erased], plan, now, TARGET_NOT_FOUND, lambda c: (
            f"targets {_describe_missing(c['missing'])} not found in engagement_activity within the "
            f"{' and '.join(c['horizons'])} horizon: "
            f"{horizon_batches} batch(es) after batch {c['first_seen_batch']} ({c['attempts'] + 1} attempts), "
            f"{max_age_hours:g} h after {iso(c['first_seen_at'] or as_of)} (batch as-of {iso(as_of)})")),
    ])

    merge_metrics: dict = {}
    seconds["merge"] = 0.0

    def merge_step(txn: BatchTxn, _: Outcomes) -> int | None:
        lake.ensure(ENGAGEMENT_ACTIVITY)
        if lake.already_committed(ENGAGEMENT_ACTIVITY.name, txn):
            info = lake.batch_commit(ENGAGEMENT_ACTIVITY.name, APP_ID, batch) or {}
            merge_metrics.update(info.get("operationMetrics") or {})
            return None
        if source.num_rows == 0:
            return None  # nothing to change: no commit (a re-run finds nothing to do either)
        t = time.perf_counter()
        metrics = (
            lake.merge(ENGAGEMENT_ACTIVITY, source, _merge_predicate(merge_orgs), txn)
            .when_matched_update_all(predicate=f"s.{ACTION} = '{UPDATE}'", except_cols=[ACTION])
            .when_matched_delete(predicate=f"s.{ACTION} = '{DELETE}'")
            .execute()
        )
        merge_metrics.update(metrics)
        seconds["merge"] = time.perf_counter() - t
        return lake.table(ENGAGEMENT_ACTIVITY.name).version()

    def pending_step(txn: BatchTxn, _: Outcomes) -> int | None:
        table = lake.ensure(ENGAGEMENT_MUTATIONS_PENDING)
        if lake.already_committed(ENGAGEMENT_MUTATIONS_PENDING.name, txn):
            return None
        if pending_delta.num_rows == 0:
            return None  # nothing carried, nothing held back: no commit (a re-run finds nothing to do either)
        # One MERGE with the txn against the current table (not an overwrite of the pinned set): rows an erasure
        # deleted after the pin are neither in the source nor matched, so they stay deleted.
        orgs = ", ".join(sql_literal(o) for o in pc.unique(pending_delta["org_id"]).to_pylist())
        (table.merge(pending_delta, predicate=f"t.org_id IN ({orgs}) AND t.org_id = s.org_id AND t.request_id = s.request_id",
                     source_alias="s", target_alias="t", merge_schema=True, commit_properties=txn.commit_properties())
         .when_matched_update_all(predicate=f"s.{PENDING_ACTION} = '{UPSERT}'", except_cols=[PENDING_ACTION])
         .when_matched_delete(predicate=f"s.{PENDING_ACTION} = '{PENDING_DELETE}'")
         .when_not_matched_insert_all(predicate=f"s.{PENDING_ACTION} = '{UPSERT}'", except_cols=[PENDING_ACTION])
         .execute())
        table.update_incremental()
        return table.version()

    def notify(txn: BatchTxn, done: Outcomes) -> int | None:
        version = done.get(ENGAGEMENT_ACTIVITY.name)
        if version is None:  # an earlier attempt committed the MERGE (or there was nothing to merge)
            version = lake.find_batch_commit(ENGAGEMENT_ACTIVITY.name, APP_ID, batch) if lake.exists(ENGAGEMENT_ACTIVITY.name) else None
        if version is None:
            rows = ENGAGEMENT_NOTIFICATIONS.schema.empty_table()
        else:
            rows = notification_rows(lake, ENGAGEMENT_NOTIFICATIONS, ENGAGEMENT_ACTIVITY.name, version, APP_ID, batch, now)
        return lake.append(ENGAGEMENT_NOTIFICATIONS, rows, txn)

    seconds["log_rows"] = time.perf_counter() - t5
    t6 = time.perf_counter()
    versions = commit_batch(
        plan,
        APP_ID,
        [
            CommitStep(ENGAGEMENT_MUTATION_REQUESTS.name, lambda txn, _: lake.append(ENGAGEMENT_MUTATION_REQUESTS, log_rows, txn)),
            CommitStep(ENGAGEMENT_ACTIVITY.name, merge_step),
            CommitStep(ENGAGEMENT_MUTATIONS_PENDING.name, pending_step),
            CommitStep(QUARANTINE_ENGAGEMENT_MUTATIONS.name, lambda txn, _: lake.append(QUARANTINE_ENGAGEMENT_MUTATIONS, quarantine, txn)),
            CommitStep(ENGAGEMENT_NOTIFICATIONS.name, notify),
        ],
        checkpoints,
        ranges=plan.ranges_json(),
        as_of=as_of.isoformat(),
        **snapshot,  # pinned in every commit's metadata; the request log's is read back by a re-run
    )
    seconds["commits_other"] = time.perf_counter() - t6 - seconds["merge"]
    from_pending = np.asarray(candidates["from_pending"].to_numpy(zero_copy_only=False), dtype=bool)
    return MutationResult(
        plan=plan,
        requests_read=validated.num_rows,
        requests_valid=arrived.num_rows,
        requests_malformed=validated.num_rows - arrived.num_rows,
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
        snapshot=snapshot,
        org_ids=orgs,
        seconds=seconds,
        reducer=reduced.reducer,
    )


def _log_rows(new: pa.Table, outcome: np.ndarray, plan: BatchPlan, at: datetime) -> pa.Table:
    """The request log's rows of this batch's new requests (candidate rows), with each one's outcome code."""
    n = new.num_rows
    columns = {name: new[name] for name in ENGAGEMENT_MUTATION_REQUESTS.schema.names if name in new.column_names}
    columns.update(request_date=pc.cast(new["request_time"], pa.date32()), outcome=OUTCOMES.take(pa.array(outcome, pa.int64())),
                   batch_id=pa.array([plan.batch_id] * n, pa.int64()), received_at=pa.array([at] * n, pa.timestamp("us", tz="UTC")))
    return pa.table({name: columns[name] for name in ENGAGEMENT_MUTATION_REQUESTS.schema.names}).cast(ENGAGEMENT_MUTATION_REQUESTS.schema)


# ---- one planned batch by hand (recovery, crash tests); the lead wires Dagster ---------------------


def main(argv: list[str] | None = None) -> None:
    from engagement_platform.settings import load_settings
    from engagement_platform.spark.session import build_session, session_config

    parser = argparse.ArgumentParser(prog="python -m engagement_platform.engagement.mutation.apply")
    parser.add_argument("--batch-id", type=int, required=True)
    parser.add_argument("--horizon-batches", type=int, default=DEFAULT_HORIZON_BATCHES)
    args = parser.parse_args(argv)
    settings = load_settings()
    lake = DeltaLake(settings.lake_root)
    store = CheckpointStore(lake)
    spark = build_session(session_config(settings.spark_remote, settings.spark_master))
    result = apply_mutation_batch(spark, lake, store, settings.kafka_bootstrap_servers, store.plan(STREAM, args.batch_id), args.horizon_batches)
    print(json.dumps(result.metadata(), default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
