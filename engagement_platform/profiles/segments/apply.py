"""Segment evaluation of one tenant, as a batch: every segment over every merged profile in one pass, in a
Spark task, then membership and its change log committed exactly once.

plan     stream `profile_segments/<tenant>`, a TableVersionsSlice of the tenant's raw table: (versions
         evaluated last time, the current one]. The raw table is read at `up_to`.
compute  one Spark task reads the raw table's files at that version, groups the live rows by merged
         identity (component_id) and evaluates every segment (evaluate.py); only (identity, segment)
         pairs come back to the driver. Entries and exits are the difference with the membership the
         batch started from (pinned in its first commit's metadata, with the evaluation time).
commit   profile_segment_changes (append, carries the pin), then profile_segments (the tenant's files
         replaced in one commit: lake/file_writes), each with the txn (app id, batch id); then done.

Incremental: with the previous evaluation's definitions unchanged (a digest in its commit metadata), only
the identities whose rows changed in the slice's raw versions (rows of the files added or removed there),
plus those whose windowed aggregates time alone may have moved (evaluate.time_affected), are evaluated;
every other identity keeps its membership. A changed definition, a first run, or a slice whose old version
or removed files are gone (past the erasure window) evaluates every identity. `identities_evaluated` and
`mode` say which.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.exceptions import DeltaError
from pyspark.sql import SparkSession

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.file_writes import commit_files, delete_uncommitted, filesystem, write_files, writer_tag
from engagement_platform.lake.row_erasure import live_files
from engagement_platform.profiles.segments.definitions import Segment
from engagement_platform.profiles.segments.evaluate import RECORD_COLUMNS, ProfileRecord, evaluate, time_affected, windows_of
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS
from engagement_platform.profiles.tables import raw_table_name
from engagement_platform.spark.handoff import HANDOFF_SCHEMA, collect_handoff, handoff
from engagement_platform.streams.batch import CommitStep, Outcomes, commit_batch
from engagement_platform.streams.pin import AS_OF, pin_batch
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.slices import TableVersionsSlice

MEMBERS = "members"
MEMBER_SCHEMA = pa.schema([("identity", pa.string()), ("segment", pa.string())])
READ_COLUMNS = [*RECORD_COLUMNS, "fields", "component_id", "deleted"]
FINGERPRINT = "segments_fingerprint"  # commit metadata: the definitions the evaluation used


def segments_stream(tenant: str) -> str:
    return f"profile_segments/{tenant}"


def segments_app_id(tenant: str) -> str:
    return f"profile.segments/{tenant}"


def plan_evaluation(lake: DeltaLake, checkpoints: CheckpointStore, tenant: str) -> BatchPlan | None:
    """The tenant's unfinished evaluation, else a new one up to the raw table's current version (None: no raw table)."""
    stream = segments_stream(tenant)
    latest = checkpoints.latest_plan(stream)
    if latest is not None and not checkpoints.is_done(stream, latest.batch_id):
        return latest
    if not lake.exists(raw_table_name(tenant)):
        return None
    after = latest.slice_as(TableVersionsSlice).up_to if latest else -1
    plan = BatchPlan(stream, (latest.batch_id + 1) if latest else 1, TableVersionsSlice(raw_table_name(tenant), after, lake.table(raw_table_name(tenant)).version()))
    checkpoints.record_plan(plan)
    return plan


def segments_fingerprint(segments: list[Segment]) -> str:
    """A digest of the definitions: a change (a segment added, removed or edited) makes the next run full."""
    return hashlib.sha256(repr(sorted((s.name, repr(s.where)) for s in segments)).encode()).hexdigest()


def changed_identities(lake: DeltaLake, raw: TableVersionsSlice) -> set[str]:
    """Identities whose rows changed in the raw versions (after, up_to]: the component ids of the rows in the
    files those commits added (new states) and removed (old states: an identity relabelled or split)."""
    before, now = set(lake.table(raw.table, raw.after).file_uris()), set(lake.table(raw.table, raw.up_to).file_uris())
    ids: set[str] = set()
    for uri in (now - before) | (before - now):
        fs, path = filesystem(uri, lake.storage_options)
        ids |= set(pq.read_table(path, columns=["component_id"], filesystem=fs)["component_id"].to_pylist())
    return {i for i in ids if i is not None}


def evaluation_task(files: list[str], segments: list[Segment], now: datetime, storage_options: dict | None,
                    changed: set[str] | None = None, before: datetime | None = None):
    """The mapInArrow function: one task reads the tenant's raw files and hands back (identity, segment) pairs
    of the identities it evaluates: all of them (`changed` None), or the changed ones plus those whose
    windowed aggregates time alone may have moved since `before` (evaluate.time_affected)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        if not sum(b.num_rows for b in batches):  # spark.range(1) may also start an empty partition
            return
        tables = []
        for uri in files:
            fs, path = filesystem(uri, storage_options)
            tables.append(pq.read_table(path, columns=READ_COLUMNS, filesystem=fs))
        rows = [r for r in (pa.concat_tables(tables, promote_options="permissive").to_pylist() if tables else []) if not r["deleted"]]
        wanted = None
        if changed is not None:
            wanted = set(changed) | time_affected(((r["component_id"], r["cdc_ts"]) for r in rows), windows_of(segments), before, now)
        identities: dict[str, list[ProfileRecord]] = {}
        for row in rows:
            if wanted is None or row["component_id"] in wanted:
                identities.setdefault(row["component_id"], []).append(ProfileRecord.of_row(row))
        pairs = evaluate(identities.items(), segments, now)
        yield from handoff(MEMBERS, pa.Table.from_pylist([{"identity": i, "segment": s} for i, s in pairs], schema=MEMBER_SCHEMA))
        yield from handoff("identities", pa.table({"n": pa.array([len(identities)], pa.int64())}))
        yield from handoff("evaluated", pa.table({"identity": pa.array(sorted(identities), pa.string())}))

    return run


@dataclass
class SegmentResult:
    plan: BatchPlan
    tenant: str
    segments: int
    identities_evaluated: int
    members: int
    entered: int
    exited: int
    versions: Outcomes
    by_segment: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    mode: str = "full"  # full | incremental

    def metadata(self) -> dict:
        return {"tenant": self.tenant, "batch_id": self.plan.batch_id, "segments": self.segments, "mode": self.mode,
                "identities_evaluated": self.identities_evaluated, "members": self.members, "entered": self.entered,
                "exited": self.exited, **{f"size_{s}": n for s, n in sorted(self.by_segment.items())},
                **{f"{t}_version": v for t, v in self.versions.items()}, **{f"seconds_{k}": round(v, 3) for k, v in self.seconds.items()}}


def current_members(lake: DeltaLake, tenant: str, version: int) -> dict[tuple[str, str], dict]:
    """(segment, identity) -> membership row of the tenant at `version` (-1: none yet)."""
    if version < 0 or not lake.exists(PROFILE_SEGMENTS.name):
        return {}
    rows = lake.table(PROFILE_SEGMENTS.name, version).to_pyarrow_dataset().to_table(filter=pc.field("tenant") == tenant).to_pylist()
    return {(r["segment"], r["identity"]): r for r in rows}


def evaluate_tenant(spark: SparkSession, lake: DeltaLake, checkpoints: CheckpointStore, tenant: str, plan: BatchPlan,
                    segments: list[Segment]) -> SegmentResult:
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    raw = plan.slice_as(TableVersionsSlice)
    app = segments_app_id(tenant)
    pin = pin_batch(lake, PROFILE_SEGMENT_CHANGES.name, app, plan.batch_id, [PROFILE_SEGMENTS.name])
    files = lake.table(raw.table, raw.up_to).file_uris()
    fingerprint = segments_fingerprint(segments)
    previous = lake.batch_commit(PROFILE_SEGMENT_CHANGES.name, app, plan.batch_id - 1) if raw.after >= 0 else None
    incremental = bool(previous) and previous.get(FINGERPRINT) == fingerprint and AS_OF in previous
    changed = None
    if incremental:
        try:
            changed = changed_identities(lake, raw)
        except (OSError, DeltaError):  # the old version's log or removed files are gone (erasure window): evaluate in full
            incremental = False
    since = datetime.fromisoformat(previous[AS_OF]) if incremental else None
    task = evaluation_task(files, segments, pin.as_of, lake.storage_options, changed, since)
    handed = collect_handoff(spark.range(1, numPartitions=1).mapInArrow(task, HANDOFF_SCHEMA))
    pairs = handed.get(MEMBERS, MEMBER_SCHEMA.empty_table())
    evaluated = int(pc.sum(handed["identities"]["n"]).as_py() or 0) if "identities" in handed else 0
    seconds["evaluate"] = time.perf_counter() - t0

    before = current_members(lake, tenant, pin.versions[PROFILE_SEGMENTS.name])
    now_in = {(r["segment"], r["identity"]) for r in pairs.to_pylist()}
    if incremental:  # identities not re-evaluated keep their membership
        evaluated_ids = set(handed["evaluated"]["identity"].to_pylist()) if "evaluated" in handed else set()
        now_in |= {key for key in before if key[1] not in evaluated_ids and key[1] not in changed}
    entered, exited = sorted(now_in - set(before)), sorted(set(before) - now_in)
    membership = pa.Table.from_pylist([
        {"tenant": tenant, "segment": s, "identity": i, "entered_at": before[(s, i)]["entered_at"] if (s, i) in before else pin.as_of,
         "batch_id": before[(s, i)]["batch_id"] if (s, i) in before else plan.batch_id} for s, i in sorted(now_in)], schema=PROFILE_SEGMENTS.schema)
    changes = pa.Table.from_pylist([
        {"tenant": tenant, "segment": s, "identity": i, "change": kind, "evaluated_at": pin.as_of, "raw_version": raw.up_to, "batch_id": plan.batch_id}
        for kind, keys in (("entered", entered), ("exited", exited)) for s, i in keys], schema=PROFILE_SEGMENT_CHANGES.schema)

    def replace_membership(txn: BatchTxn, _: Outcomes) -> int | None:
        lake.ensure(PROFILE_SEGMENTS)
        if lake.already_committed(PROFILE_SEGMENTS.name, txn):
            return None
        tag = writer_tag(app.replace("/", "_"), plan.batch_id)
        delete_uncommitted(lake, PROFILE_SEGMENTS, tag)
        adds = write_files(lake.uri(PROFILE_SEGMENTS.name), PROFILE_SEGMENTS, membership, tag, lake.storage_options)
        return commit_files(lake, PROFILE_SEGMENTS, adds, txn, live_files(lake, PROFILE_SEGMENTS, {"tenant": tenant}))

    t1 = time.perf_counter()
    versions = commit_batch(plan, app, [
        CommitStep(PROFILE_SEGMENT_CHANGES.name, lambda txn, _: lake.append(PROFILE_SEGMENT_CHANGES, changes, txn)),
        CommitStep(PROFILE_SEGMENTS.name, replace_membership),
    ], checkpoints, **pin.metadata(), **{FINGERPRINT: fingerprint})
    seconds["commit"] = time.perf_counter() - t1
    by_segment: dict[str, int] = {s.name: 0 for s in segments}
    for s, _ in now_in:
        by_segment[s] = by_segment.get(s, 0) + 1
    return SegmentResult(plan, tenant, len(segments), evaluated, len(now_in), len(entered), len(exited), versions, by_segment, seconds,
                         "incremental" if incremental else "full")
