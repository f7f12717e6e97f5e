"""The executor side of a segment evaluation: a Spark task evaluates a group of tenants, those that share
definitions and an evaluation time together as the parts of one set of profiles. It reads each tenant's raw
files, finds the identities to evaluate, evaluates every segment in one pass (evaluate.py), diffs the result with the membership the batch started from (the base with the log merged
on read: current.py), and writes the entries and exits as Parquet files into the change log's folder.
Only file actions and counts go back to the driver, which commits them. The base is not rewritten: a
compaction folds the log into it (compaction.py).

Incremental work (`TenantWork.incremental`): the identities whose rows changed between the raw versions of
the slice are the components of the rows that differ between the files the slice's commits added and the
files they removed (a file a MERGE copied unchanged rows into does not make those rows changed), plus the
identities whose windowed aggregates time alone may have moved (evaluate.time_affected). Only their rows
are parsed and evaluated, and only their stored membership is kept when the base and the log are read:
every other identity keeps its membership without a row of it being decoded. When the removed files are
gone (the erasure window), the task evaluates every identity and says so (`mode`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.file_writes import WrittenFile, filesystem, read_parquet, write_files
from engagement_platform.profiles.segments.array_warnings import array_rows
from engagement_platform.profiles.segments.columns import RECORD_COLUMNS, constant, profiles_of
from engagement_platform.profiles.segments.current import current_membership
from engagement_platform.profiles.segments.definitions import Segment
from engagement_platform.profiles.segments.evaluate import evaluate, paths_of, time_affected, windows_of
from engagement_platform.profiles.segments.membership import membership_diff
from engagement_platform.profiles.segments.stored import read_stored
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES
from engagement_platform.profiles.tables import RAW_SCHEMA
from engagement_platform.spark.handoff import handoff

READ_COLUMNS = [*RECORD_COLUMNS, "component_id", "deleted"]
ROW_STATE = [
    "primary_id",
    "component_id",
    "cdc_seq",
    "deleted",
    "batch_id",
]  # what a processor, backfill or erasure write changes
PHASES = ("read", "evaluate", "diff", "write")
RESULT_SCHEMA = pa.schema(
    [
        ("tenant", pa.string()),
        ("mode", pa.string()),
        ("identities", pa.int64()),
        ("members", pa.int64()),
        ("entered", pa.int64()),
        ("exited", pa.int64()),
        *((f"seconds_{p}", pa.float64()) for p in PHASES),
    ]
)
SIZES_SCHEMA = pa.schema([("tenant", pa.string()), ("segment", pa.string()), ("members", pa.int64())])
# Records evaluated whose JSON path held an array where a scalar op reads it (array_warnings.py).
ARRAYS_SCHEMA = pa.schema([("tenant", pa.string()), ("path", pa.string()), ("records", pa.int64())])


@dataclass(frozen=True)
class TenantWork:
    """What one task needs to evaluate a tenant's batch (prepared and pinned by the driver)."""

    tenant: str
    batch_id: int
    segments: tuple[Segment, ...]
    now: datetime  # the batch's pinned evaluation time
    raw_files: tuple[str, ...]  # the raw table's files at the slice's version
    base_files: tuple[str, ...]  # the tenant's base membership files at the pinned base version
    log_files: tuple[str, ...]  # its change-log files holding batches after `through`, at the pinned log version
    through: int  # the batch the base is compacted through (-1: none)
    changes_uri: str
    raw_version: int
    tag: str  # writer tag of the batch's files
    write_changes: bool  # False when an earlier attempt already committed the batch's changes
    incremental: bool = False
    since: datetime | None = None  # the previous evaluation's time
    added_files: tuple[str, ...] = ()  # raw files the slice's commits added
    removed_files: tuple[str, ...] = ()  # and removed


def _read(uris, columns: list[str] | None, storage_options) -> pa.Table | None:
    tables = []
    for uri in uris:
        fs, path = filesystem(uri, storage_options)
        tables.append(_plain(read_parquet(fs, path, columns=columns)))
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def _plain(table: pa.Table) -> pa.Table:
    """Views and large strings (delta-rs writes string views) as plain strings, so every kernel takes them."""
    plain = [
        pa.field(f.name, pa.string()) if f.type in (pa.string_view(), pa.large_string()) else f for f in table.schema
    ]
    return table.cast(pa.schema(plain)) if plain != list(table.schema) else table


def _same(a: pa.ChunkedArray, b: pa.ChunkedArray) -> np.ndarray:
    """Per row: are the two values equal (two nulls are)?"""
    equal = pc.or_(pc.equal(a, b).fill_null(False), pc.and_(a.is_null(), b.is_null()))
    return np.asarray(equal.to_numpy(), bool)


def differing_components(added: pa.Table, removed: pa.Table) -> pa.Array:
    """Components of the rows (ROW_STATE) of one side that have no equal row on the other. A raw table holds
    one row per primary id, so the rows pair up by it and only the pairs' other columns are compared; when an
    id repeats on a side (or is null), every row's whole state is compared as one string instead."""
    ids = pa.chunked_array([*added["primary_id"].chunks, *removed["primary_id"].chunks], pa.string())
    codes = ids.combine_chunks().dictionary_encode()
    n, values = added.num_rows, len(codes.dictionary)
    if codes.null_count:
        return _differing_by_state(added, removed)
    code = np.asarray(codes.indices.to_numpy(zero_copy_only=False), np.int64)
    mine, theirs = code[:n], code[n:]
    if len(mine) and np.bincount(mine, minlength=values).max() > 1:
        return _differing_by_state(added, removed)
    if len(theirs) and np.bincount(theirs, minlength=values).max() > 1:
        return _differing_by_state(added, removed)
    at = np.full(values, -1, np.int64)
    at[theirs] = np.arange(len(theirs))
    paired = at[mine]  # per added row: the removed row with its primary id, or -1
    both = np.flatnonzero(paired >= 0)
    old_rows = removed.take(pa.array(paired[both]))
    new_rows = added.take(pa.array(both))
    same = np.ones(len(both), bool)
    for column in ROW_STATE[1:]:
        same &= _same(new_rows[column], old_rows[column])
    changed_new = np.ones(n, bool)
    changed_new[both[same]] = False
    changed_old = np.ones(removed.num_rows, bool)
    changed_old[paired[both[same]]] = False
    components = pa.chunked_array(
        [
            *added["component_id"].filter(pa.array(changed_new)).chunks,
            *removed["component_id"].filter(pa.array(changed_old)).chunks,
        ],
        pa.string(),
    )
    return pc.unique(components.combine_chunks().drop_null())


def _differing_by_state(added: pa.Table, removed: pa.Table) -> pa.Array:
    def keys(rows: pa.Table) -> pa.ChunkedArray:  # a row's state as one string: its values joined, a null as NUL
        return pc.binary_join_element_wise(*(rows[c].cast(pa.string()).fill_null("\x00") for c in ROW_STATE), "\x1f")

    new, old = keys(added), keys(removed)
    differ = [
        added["component_id"].filter(pc.invert(pc.is_in(new, value_set=old))),
        removed["component_id"].filter(pc.invert(pc.is_in(old, value_set=new))),
    ]
    return pc.unique(pa.chunked_array([*differ[0].chunks, *differ[1].chunks], pa.string()).combine_chunks().drop_null())


def changed_components(work: TenantWork, read: dict[str, pa.Table], storage_options) -> pa.Array:
    """Components of the rows that differ between the slice's added and removed raw files (OSError: a removed
    file is gone). `read`: files already read (with ROW_STATE), by URI; the added files are among the raw
    files the task reads anyway."""
    added = _concat(
        [read[uri] if uri in read else _read([uri], ROW_STATE, storage_options) for uri in work.added_files]
    )
    removed = _read(work.removed_files, ROW_STATE, storage_options)
    if added is None or removed is None:
        rows = added if added is not None else removed
        return pc.unique(rows["component_id"]) if rows is not None else pa.array([], pa.string())
    return differing_components(added.select(ROW_STATE), removed)


def _concat(tables: list[pa.Table | None]) -> pa.Table | None:
    present = [t for t in tables if t is not None]
    return pa.concat_tables(present, promote_options="permissive") if present else None


@dataclass
class Gathered:
    """One tenant's rows to evaluate, as its task read them."""

    work: TenantWork
    mode: str  # full | incremental
    changed: pa.Array  # components whose rows changed in the slice (incremental)
    rows: pa.Table  # the live raw rows (READ_COLUMNS) of the identities to evaluate
    seconds: float


def gather(work: TenantWork, storage_options) -> Gathered:
    """The tenant's live raw rows; for an incremental run only those of the identities it must evaluate."""
    t0 = time.perf_counter()
    columns = list(dict.fromkeys([*READ_COLUMNS, *ROW_STATE])) if work.incremental else READ_COLUMNS
    read = {uri: _read([uri], columns, storage_options) for uri in work.raw_files}
    raw = _concat(list(read.values()))
    raw = (
        raw.filter(pc.invert(raw["deleted"].fill_null(False)))
        if raw is not None
        else RAW_SCHEMA.empty_table().select(columns)
    )
    mode, changed = "full", pa.array([], pa.string())
    if work.incremental:
        try:
            changed = changed_components(work, read, storage_options)
            mode = "incremental"
        except OSError:
            mode = "full"
    if mode == "incremental":
        cdc = np.asarray(
            raw["cdc_ts"].combine_chunks().cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).fill_null(0), np.int64
        )
        moved = raw["component_id"].filter(
            pa.array(time_affected(cdc, windows_of(work.segments), work.since, work.now))
        )
        wanted = pa.concat_arrays([changed, pc.unique(moved.combine_chunks())])
        raw = raw.filter(pc.is_in(raw["component_id"], value_set=wanted))
    return Gathered(work, mode, changed, raw.select(READ_COLUMNS), time.perf_counter() - t0)


PART = "_part"  # which tenant of an evaluation group a row is of


# A group stops growing at this many records: past it the plan's fixed cost is small beside the column work,
# and longer columns fall out of the CPU's caches (eight full tenants of 20,000 records evaluated together
# took 15% longer than each alone on this project's machine).
TOGETHER_RECORDS = 16_384


def _plan_key(work: TenantWork) -> tuple:
    """Works with the same key can share one evaluation: the same definitions (the same tuple, as the works
    of one job share it: prepare_all) and the same evaluation time."""
    return id(work.segments), work.now  # one tuple of definitions, shared by the works of one job


def evaluate_works(
    works: list[TenantWork], storage_options
) -> Iterator[tuple[TenantWork, dict, pa.Table, pa.Table, list[WrittenFile]]]:
    """(work, counts, sizes per segment, arrays under scalar ops, change files) of each tenant's batch.
    Consecutive tenants that share definitions and an evaluation time are evaluated together, as the parts
    of one set of profiles, up to TOGETHER_RECORDS records: the plan's per-condition cost (a thousand
    segments' conditions, each a few column operations) is then paid once per group rather than once per
    tenant, which is most of an incremental run's cost on a small tenant."""
    group: list[Gathered] = []
    for work in works:
        gathered = gather(work, storage_options)
        if group and (
            _plan_key(group[0].work) != _plan_key(work)
            or sum(g.rows.num_rows for g in group) + gathered.rows.num_rows > TOGETHER_RECORDS
        ):
            yield from _evaluate_group(group, storage_options)
            group = []
        group.append(gathered)
    if group:
        yield from _evaluate_group(group, storage_options)


def _evaluate_group(
    gathered: list[Gathered], storage_options
) -> Iterator[tuple[TenantWork, dict, pa.Table, pa.Table, list[WrittenFile]]]:
    t0 = time.perf_counter()
    segments, now = gathered[0].work.segments, gathered[0].work.now
    rows = pa.concat_tables(
        [g.rows.append_column(PART, constant(i, pa.int64(), g.rows.num_rows)) for i, g in enumerate(gathered)],
        promote_options="permissive",
    )
    profiles = profiles_of(rows, paths_of(segments), within=PART)
    results = evaluate(profiles, segments, now)
    ranges = profiles.part_ranges(len(gathered))
    arrays = [array_rows(profiles, segments, records) for _, records in ranges]
    evaluated = time.perf_counter() - t0
    for g, (identities, records), held in zip(gathered, ranges, arrays):
        share = (records.stop - records.start) / max(profiles.records, 1)  # its records' part of the plan
        yield (
            g.work,
            *_finish(
                g,
                profiles.keys[identities],
                {name: verdict[identities] for name, verdict in results.items()},
                held,
                float(evaluated * share),
                storage_options,
            ),
        )


def _finish(
    g: Gathered,
    keys: pa.Array,
    results: dict[str, np.ndarray],
    arrays: dict[str, int],
    evaluated: float,
    storage_options,
) -> tuple[dict, pa.Table, pa.Table, list[WrittenFile]]:
    """Diff a tenant's verdicts with the membership its batch starts from, and write the entries and exits."""
    work, changed = g.work, g.changed
    t0 = time.perf_counter()
    incremental = g.mode == "incremental"
    wanted = pc.unique(pa.concat_arrays([keys.cast(pa.string()), changed])) if incremental else None
    stored = read_stored(
        work.base_files,
        work.log_files,
        storage_options,
        identities=wanted,
        after_batch=work.through,
        sizes=incremental,
        pairs_only=True,
    )
    # identities not evaluated keep their rows unless they changed (gone); an incremental run only read the
    # stored rows of the identities it evaluated or saw change, so every other one keeps its membership
    diff = membership_diff(
        current_membership(stored.base, stored.log),
        keys,
        results,
        changed if incremental else None,
    )
    sizes_now = diff.sizes if not incremental else _moved_sizes(stored.sizes, diff, list(diff.sizes))
    changes = pa.concat_tables([_changes(work, diff.entered, "entered"), _changes(work, diff.exited, "exited")])
    t1 = time.perf_counter()
    change_files = (
        write_files(work.changes_uri, PROFILE_SEGMENT_CHANGES, changes, work.tag, storage_options)
        if work.write_changes and changes.num_rows
        else []
    )
    counts = {
        "tenant": work.tenant,
        "mode": g.mode,
        "identities": len(keys),
        "members": sum(sizes_now.values()),
        "entered": diff.entered.num_rows,
        "exited": diff.exited.num_rows,
        "seconds_read": g.seconds,
        "seconds_evaluate": evaluated,
        "seconds_diff": t1 - t0,
        "seconds_write": time.perf_counter() - t1,
    }
    sizes = pa.table(
        {
            "tenant": pa.array([work.tenant] * len(sizes_now), pa.string()),
            "segment": pa.array(list(sizes_now), pa.string()),
            "members": pa.array(list(sizes_now.values()), pa.int64()),
        }
    )
    held = pa.table(
        {
            "tenant": constant(work.tenant, pa.string(), len(arrays)),
            "path": pa.array(list(arrays), pa.string()),
            "records": pa.array(list(arrays.values()), pa.int64()),
        }
    )
    return counts, sizes, held, change_files


def _moved_sizes(before: dict[str, int], diff, names: list[str]) -> dict[str, int]:
    """Members per segment after an incremental run: the stored sizes, plus its entries, minus its exits."""
    sizes = {name: before.get(name, 0) for name in names}
    for pairs, weight in ((diff.entered, 1), (diff.exited, -1)):
        counted = pc.value_counts(pairs["segment"].combine_chunks().cast(pa.string()))
        for name, n in zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist()):
            sizes[name] = sizes.get(name, 0) + weight * n
    return sizes


def _changes(work: TenantWork, pairs: pa.Table, kind: str) -> pa.Table:
    n = pairs.num_rows
    return pa.table(
        {
            "tenant": constant(work.tenant, pa.string(), n),
            "segment": pairs["segment"],
            "identity": pairs["identity"],
            "change": constant(kind, pa.string(), n),
            "evaluated_at": constant(work.now, PROFILE_SEGMENT_CHANGES.schema.field("evaluated_at").type, n),
            "raw_version": constant(work.raw_version, pa.int64(), n),
            "batch_id": constant(work.batch_id, pa.int64(), n),
        }
    )


FILES_SCHEMA = pa.schema([("tenant", pa.string()), ("table", pa.string()), ("file", pa.string())])


def evaluation_task(works: list[TenantWork], storage_options):
    """The mapInArrow function over spark.range(len(works)): each row is a tenant's work to evaluate."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        mine = [works[index] for batch in batches for index in batch.column(0).to_pylist()]
        threads = pa.cpu_count()
        pa.set_cpu_count(1)  # a task is one core's work: Arrow's own threads would contend with the other tasks
        handed: dict[str, list[pa.Table]] = {"result": [], "sizes": [], "arrays": [], "files": []}
        try:
            for work, counts, sizes, held, change_files in evaluate_works(mine, storage_options):
                handed["result"].append(pa.Table.from_pylist([counts], schema=RESULT_SCHEMA))
                handed["sizes"].append(sizes)
                handed["arrays"].append(held.cast(ARRAYS_SCHEMA))
                files = [
                    {"tenant": work.tenant, "table": PROFILE_SEGMENT_CHANGES.name, "file": f.to_json()}
                    for f in change_files
                ]
                handed["files"].append(pa.Table.from_pylist(files, schema=FILES_SCHEMA))
        finally:
            pa.set_cpu_count(threads)
        for kind, tables in handed.items():  # one hand-back of each kind per task, not per tenant
            if tables:
                yield from handoff(kind, pa.concat_tables(tables))

    return run
