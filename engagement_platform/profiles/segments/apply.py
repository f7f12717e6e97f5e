"""Segment evaluation of one tenant, as a batch: every segment over every merged profile in one pass, in a
Spark task that also writes the result's files, then the entries and exits appended to the change log
exactly once.

plan     stream `profile_segments/<tenant>`, a TableVersionsSlice of the tenant's raw table: (versions
         evaluated last time, the current one]. The raw table is read at `up_to`.
prepare  on the driver: the pin (evaluation time, the versions of the base and the log the batch diffs
         against), the raw files, for an incremental run the files the slice's commits added and removed,
         and the tenant's base and log files at the pinned versions (membership_files.py).
compute  the tenants' batches share one Spark job (`evaluate_tenants`), a few Spark tasks each evaluating a
         group of tenants (task.py, `task_count`): read, evaluate, diff with the membership merged from the
         base and the log, write the entries / exits; only file actions and counts come back.
commit   profile_segment_changes (the entries and exits, carries the pin and the txn (app id, batch id)),
         then done. A batch an earlier attempt committed is not written again; what a dead attempt wrote
         is deleted first. The base (profile_segments) is rewritten only by a compaction (compaction.py).

Incremental: with the previous evaluation's definitions unchanged (a digest in its commit metadata), only
the identities whose rows changed in the slice, plus those whose windowed aggregates time alone may have
moved, are evaluated (task.py); every other identity keeps its membership. A changed definition, a first
run, or a slice whose old version or removed files are gone (past the erasure window) evaluates every
identity. `identities_evaluated` and `mode` say which.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import SparkSession

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake, holds_txn
from engagement_platform.lake.file_writes import WrittenFile, delete_uncommitted, writer_tag
from engagement_platform.profiles.segments.array_warnings import array_warnings
from engagement_platform.profiles.segments.definitions import Segment
from engagement_platform.profiles.segments.membership_files import MembershipFiles
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS
from engagement_platform.profiles.segments.task import (
    ARRAYS_SCHEMA,
    FILES_SCHEMA,
    PHASES,
    RESULT_SCHEMA,
    SIZES_SCHEMA,
    TenantWork,
    evaluation_task,
)
from engagement_platform.profiles.tables import raw_table_name
from engagement_platform.spark.handoff import HANDOFF_SCHEMA, collect_handoff
from engagement_platform.streams.batch import Batch, FilesStep, Outcomes, commit_batches
from engagement_platform.streams.pin import AS_OF, Pin, pin_batches
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.slices import TableVersionsSlice

FINGERPRINT = "segments_fingerprint"  # commit metadata: the definitions the evaluation used
PREPARE_THREADS = 4  # tenants prepared at once on the driver: each waits on the lake, not on the CPU


def segments_stream(tenant: str) -> str:
    return f"profile_segments/{tenant}"


def segments_app_id(tenant: str) -> str:
    return f"profile.segments/{tenant}"


def plan_evaluations(lake: DeltaLake, checkpoints: CheckpointStore, tenants: list[str]) -> dict[str, BatchPlan | None]:
    """Each tenant's unfinished evaluation, else a new one up to its raw table's current version (None: no raw
    table); the new plans are recorded in one checkpoint commit."""
    latest = checkpoints.latest_of([segments_stream(t) for t in tenants])
    plans: dict[str, BatchPlan | None] = {}
    new: list[BatchPlan] = []
    planning = [t for t in tenants if latest[segments_stream(t)][0] is None or latest[segments_stream(t)][1]]
    with ThreadPoolExecutor(PREPARE_THREADS) as pool:  # delta-rs opens the tables without the GIL
        versions = dict(zip(planning, pool.map(lambda t: _current_version(lake, raw_table_name(t)), planning)))
    for tenant in tenants:
        plan, _ = latest[segments_stream(tenant)]
        if tenant not in versions:  # its evaluation is unfinished: the same plan again
            plans[tenant] = plan
        elif (version := versions[tenant]) is None:  # no raw table
            plans[tenant] = None
        else:
            after = plan.slice_as(TableVersionsSlice).up_to if plan else -1
            planned = BatchPlan(
                segments_stream(tenant),
                (plan.batch_id + 1) if plan else 1,
                TableVersionsSlice(raw_table_name(tenant), after, version),
            )
            plans[tenant] = planned
            new.append(planned)
    if new:
        checkpoints.record_plans(new)
    return plans


def _current_version(lake: DeltaLake, name: str) -> int | None:
    try:
        return lake.table(name).version()
    except TableNotFoundError:
        return None


def plan_evaluation(lake: DeltaLake, checkpoints: CheckpointStore, tenant: str) -> BatchPlan | None:
    return plan_evaluations(lake, checkpoints, [tenant])[tenant]


def segments_fingerprint(segments: list[Segment]) -> str:
    """A digest of the definitions: a change (a segment added, removed or edited) makes the next run full."""
    return hashlib.sha256(repr(sorted((s.name, repr(s.where)) for s in segments)).encode()).hexdigest()


@dataclass
class Prepared:
    """One tenant's batch, pinned and ready for its task."""

    plan: BatchPlan
    pin: Pin
    fingerprint: str
    work: TenantWork


def fingerprint_key(tenant: str) -> str:
    return f"{FINGERPRINT}/{tenant}"


def prepare_all(lake: DeltaLake, batches: list[tuple[str, BatchPlan, list[Segment]]], now: datetime) -> list[Prepared]:
    """Every batch pinned: its earlier attempt's pin, else `now` and the current versions of the base and the
    log (shared by every batch not anchored yet, so their commits can share them). The anchor commits, the
    previous evaluations' commits and each pinned version of the two tables are read once for all tenants."""
    apps = [(segments_app_id(tenant), plan.batch_id) for tenant, plan, _ in batches]
    tables = [PROFILE_SEGMENTS.name, PROFILE_SEGMENT_CHANGES.name]
    pins = pin_batches(lake, PROFILE_SEGMENT_CHANGES.name, apps, tables, now)
    previous = lake.batch_commits(
        PROFILE_SEGMENT_CHANGES.name,
        [
            (app, batch - 1)
            for (app, batch), (_, plan, _) in zip(apps, batches)
            if plan.slice_as(TableVersionsSlice).after >= 0
        ],
    )
    stored = MembershipFiles(lake)
    changes = lake.table(PROFILE_SEGMENT_CHANGES.name)  # one open answers every batch's txn
    fingerprints: dict[int, str] = {}  # tenants usually share one list of definitions: digested once
    shared: dict[int, tuple[Segment, ...]] = {}  # and one tuple of it, which the tasks recognise as the same
    for _, _, segments in batches:
        if id(segments) not in fingerprints:
            fingerprints[id(segments)] = segments_fingerprint(segments)
            shared[id(segments)] = tuple(segments)
    # both pinned versions loaded before the threads start, so they share one load of each
    for pin in {(p.versions[PROFILE_SEGMENTS.name], p.versions[PROFILE_SEGMENT_CHANGES.name]) for p in pins.values()}:
        stored.load(*pin)
    # a thread per tenant in a small pool: opening a raw table at two versions is delta-rs work that runs
    # without the GIL, so two cores overlap it
    with ThreadPoolExecutor(PREPARE_THREADS) as pool:
        return list(
            pool.map(
                lambda item: prepare(
                    lake,
                    stored,
                    changes,
                    item[1][0],
                    item[1][1],
                    shared[id(item[1][2])],
                    pins[item[0]],
                    previous.get((item[0][0], item[0][1] - 1)),
                    fingerprints[id(item[1][2])],
                ),
                zip(apps, batches),
            )
        )


def prepare(
    lake: DeltaLake,
    stored: MembershipFiles,
    changes: DeltaTable,
    tenant: str,
    plan: BatchPlan,
    segments: Sequence[Segment],
    pin: Pin,
    previous: dict | None,
    fingerprint: str,
) -> Prepared:
    """One tenant's work: its raw files (and for an incremental run the slice's added and removed ones), and
    its membership files at the pinned versions."""
    raw = plan.slice_as(TableVersionsSlice)
    app = segments_app_id(tenant)
    incremental = bool(previous) and previous.get(fingerprint_key(tenant)) == fingerprint and AS_OF in previous
    added, removed = (), ()
    table = lake.table(raw.table, raw.up_to)
    files = tuple(table.file_uris())
    if incremental:
        try:
            table.load_as_version(raw.after)
            before, current = set(table.file_uris()), set(files)
            added, removed = tuple(sorted(current - before)), tuple(sorted(before - current))
        except OSError:  # the old version's log is gone (past the erasure window): evaluate every identity
            incremental = False
    tag = writer_tag(app.replace("/", "_"), plan.batch_id)
    txn = BatchTxn(app, plan.batch_id)
    write_changes = not holds_txn(changes, txn)
    if write_changes:  # what a dead attempt of this batch wrote
        delete_uncommitted(lake, PROFILE_SEGMENT_CHANGES, tag, {"tenant": tenant})
    membership = stored.of(tenant, pin.versions[PROFILE_SEGMENTS.name], pin.versions[PROFILE_SEGMENT_CHANGES.name])
    work = TenantWork(
        tenant,
        plan.batch_id,
        tuple(segments),  # the same tuple when given one (tuple() of a tuple is itself)
        pin.as_of,
        files,
        membership.base,
        membership.log,
        membership.through,
        lake.uri(PROFILE_SEGMENT_CHANGES.name),
        raw.up_to,
        tag,
        write_changes,
        incremental,
        datetime.fromisoformat(previous[AS_OF]) if incremental else None,
        added,
        removed,
    )
    return Prepared(plan, pin, fingerprint, work)


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
    array_records: dict[str, int] = field(default_factory=dict)  # path -> records with an array a scalar op read
    warnings: list[str] = field(default_factory=list)

    def metadata(self) -> dict:
        return {
            "tenant": self.tenant,
            "batch_id": self.plan.batch_id,
            "segments": self.segments,
            "mode": self.mode,
            "identities_evaluated": self.identities_evaluated,
            "members": self.members,
            "entered": self.entered,
            "exited": self.exited,
            **{f"size_{s}": n for s, n in sorted(self.by_segment.items())},
            **{f"{t}_version": v for t, v in self.versions.items()},
            **{f"seconds_{k}": round(v, 3) for k, v in self.seconds.items()},
            **{f"array_records_{p}": n for p, n in sorted(self.array_records.items())},
            **({"warnings": self.warnings} if self.warnings else {}),
        }


TENANTS_PER_TASK = 8  # tenants evaluated in full; an incremental evaluation counts as a quarter of one
INCREMENTAL_WEIGHT = 0.25


def task_count(works: list[TenantWork]) -> int:
    """Tasks for the works: one per TENANTS_PER_TASK full evaluations' worth, at least two when there are two
    works (two cores' worth). A task has a fixed cost (scheduling, its Python worker's turn: about 50 ms on
    this project's machine) that an incremental evaluation of a small tenant, about 30 ms, does not outweigh."""
    weight = sum(INCREMENTAL_WEIGHT if w.incremental else 1.0 for w in works)
    return max(min(2, len(works)), math.ceil(weight / TENANTS_PER_TASK))


def run_tasks(spark: SparkSession, lake: DeltaLake, works: list[TenantWork]) -> dict[str, pa.Table]:
    """One Spark job, a task per group of consecutive works (task_count): what the tasks handed back, by kind.
    Tenants of a task that share definitions are evaluated together (task.evaluate_works)."""
    task = evaluation_task(works, lake.storage_options)
    tasks = max(1, task_count(works))
    handed = collect_handoff(spark.range(len(works), numPartitions=tasks).mapInArrow(task, HANDOFF_SCHEMA))
    return {
        "result": handed.get("result", RESULT_SCHEMA.empty_table()),
        "sizes": handed.get("sizes", SIZES_SCHEMA.empty_table()),
        "arrays": handed.get("arrays", ARRAYS_SCHEMA.empty_table()),
        "files": handed.get("files", FILES_SCHEMA.empty_table()),
    }


@dataclass
class Handed:
    """What one tenant's task handed back."""

    counts: dict
    sizes: dict[str, int]
    written: dict[str, list[WrittenFile]]  # table name -> files
    array_records: dict[str, int] = field(default_factory=dict)  # path -> records with an array a scalar op read


def handed_by_tenant(handed: dict[str, pa.Table]) -> dict[str, Handed]:
    """The tasks' hand-back split by tenant, in one pass over each kind."""
    out = {r["tenant"]: Handed(r, {}, {PROFILE_SEGMENT_CHANGES.name: []}) for r in handed["result"].to_pylist()}
    for r in handed["sizes"].to_pylist():
        out[r["tenant"]].sizes[r["segment"]] = r["members"]
    for r in handed["arrays"].to_pylist():
        out[r["tenant"]].array_records[r["path"]] = r["records"]
    for r in handed["files"].to_pylist():
        out[r["tenant"]].written[r["table"]].append(WrittenFile.from_json(r["file"]))
    return out


def tenant_batch(lake: DeltaLake, prepared: Prepared, handed: Handed) -> Batch:
    """One tenant's commit from what its task handed back: its entries and exits appended to the log."""
    written = handed.written
    return Batch(
        prepared.plan,
        segments_app_id(prepared.work.tenant),
        [FilesStep(lake, PROFILE_SEGMENT_CHANGES, lambda _: (written[PROFILE_SEGMENT_CHANGES.name], []))],
    )


def evaluate_tenants(
    spark: SparkSession,
    lake: DeltaLake,
    checkpoints: CheckpointStore,
    batches: list[tuple[str, BatchPlan, list[Segment]]],
) -> list[SegmentResult]:
    """Several tenants' batches: pinned to one evaluation time, evaluated in one Spark job (a task each), and
    committed together: one commit per table carrying every batch's txn, then one checkpoint commit."""
    if not batches:
        return []
    t0 = time.perf_counter()
    lake.ensure(PROFILE_SEGMENT_CHANGES)
    lake.ensure(PROFILE_SEGMENTS)
    now = datetime.now(UTC)
    prepared = prepare_all(lake, batches, now)
    t1 = time.perf_counter()
    handed = handed_by_tenant(run_tasks(spark, lake, [p.work for p in prepared]))
    t2 = time.perf_counter()
    fresh = next(
        (p.pin for p in prepared if p.pin.as_of == now), prepared[0].pin
    )  # the pin every batch not anchored yet shares
    committed = commit_batches(
        [tenant_batch(lake, p, handed[p.work.tenant]) for p in prepared],
        checkpoints,
        **fresh.metadata(),
        **{fingerprint_key(p.work.tenant): p.fingerprint for p in prepared},
    )
    seconds = {"prepare": t1 - t0, "evaluate": t2 - t1, "commit": time.perf_counter() - t2}
    results = []
    for p, (_, _, segments), versions in zip(prepared, batches, committed.outcomes):
        counts = handed[p.work.tenant].counts
        by_segment = {s.name: 0 for s in segments} | handed[p.work.tenant].sizes
        results.append(
            SegmentResult(
                p.plan,
                p.work.tenant,
                len(segments),
                counts["identities"],
                counts["members"],
                counts["entered"],
                counts["exited"],
                versions,
                by_segment,
                {**seconds, **{f"task_{k}": counts[f"seconds_{k}"] for k in PHASES}},
                counts["mode"],
                handed[p.work.tenant].array_records,
                array_warnings(segments, handed[p.work.tenant].array_records),
            )
        )
    return results


def evaluate_tenant(
    spark: SparkSession,
    lake: DeltaLake,
    checkpoints: CheckpointStore,
    tenant: str,
    plan: BatchPlan,
    segments: list[Segment],
) -> SegmentResult:
    (result,) = evaluate_tenants(spark, lake, checkpoints, [(tenant, plan, segments)])
    return result
