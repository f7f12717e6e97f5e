"""The executor side of a segment evaluation: a Spark task evaluates a group of tenants, each on its own. It
reads the tenant's raw files, finds the identities to evaluate, evaluates every segment in one pass
(evaluate.py), diffs the result with the membership the batch started from (the base with the log merged
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


def _state_keys(rows: pa.Table) -> pa.ChunkedArray:
    """Each row's state as one string (its ROW_STATE values joined; a null as NUL): rows compare by it."""
    return pc.binary_join_element_wise(*(rows[c].cast(pa.string()).fill_null("\x00") for c in ROW_STATE), "\x1f")


def changed_components(work: TenantWork, storage_options) -> pa.Array:
    """Components of the rows that differ between the slice's added and removed raw files (OSError: a removed
    file is gone)."""
    added = _read(work.added_files, ROW_STATE, storage_options)
    removed = _read(work.removed_files, ROW_STATE, storage_options)
    if added is None or removed is None:
        rows = added if added is not None else removed
        return pc.unique(rows["component_id"]) if rows is not None else pa.array([], pa.string())
    new, old = _state_keys(added), _state_keys(removed)
    differ = [  # a set test on one key per row: cheaper than joining on five columns
        added["component_id"].filter(pc.invert(pc.is_in(new, value_set=old))),
        removed["component_id"].filter(pc.invert(pc.is_in(old, value_set=new))),
    ]
    return pc.unique(pa.chunked_array([*differ[0].chunks, *differ[1].chunks], pa.string()).combine_chunks().drop_null())


def evaluate_work(work: TenantWork, storage_options) -> tuple[dict, pa.Table, pa.Table, list[WrittenFile]]:
    """(counts, sizes per segment, arrays under scalar ops, change files) of one tenant's batch."""
    segments, clock = list(work.segments), [time.perf_counter()]
    raw = _read(work.raw_files, READ_COLUMNS, storage_options)
    raw = (
        raw.filter(pc.invert(raw["deleted"].fill_null(False)))
        if raw is not None
        else RAW_SCHEMA.empty_table().select(READ_COLUMNS)
    )
    mode, changed = "full", pa.array([], pa.string())
    if work.incremental:
        try:
            changed = changed_components(work, storage_options)
            mode = "incremental"
        except OSError:
            mode = "full"
    if mode == "incremental":
        cdc = np.asarray(
            raw["cdc_ts"].combine_chunks().cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).fill_null(0), np.int64
        )
        moved = raw["component_id"].filter(pa.array(time_affected(cdc, windows_of(segments), work.since, work.now)))
        wanted = pa.concat_arrays([changed, pc.unique(moved.combine_chunks())])
        raw = raw.filter(pc.is_in(raw["component_id"], value_set=wanted))
    clock.append(time.perf_counter())
    profiles = profiles_of(raw, paths_of(segments))
    results = evaluate(profiles, segments, work.now)
    arrays = array_rows(profiles, segments)
    clock.append(time.perf_counter())

    incremental = mode == "incremental"
    wanted = pc.unique(pa.concat_arrays([profiles.keys.cast(pa.string()), changed])) if incremental else None
    stored = read_stored(
        work.base_files, work.log_files, storage_options, identities=wanted, after_batch=work.through, sizes=incremental
    )
    # identities not evaluated keep their rows unless they changed (gone); an incremental run only read the
    # stored rows of the identities it evaluated or saw change, so every other one keeps its membership
    diff = membership_diff(
        current_membership(stored.base, stored.log),
        profiles.keys,
        results,
        work.now,
        work.batch_id,
        changed if incremental else None,
    )
    sizes_now = diff.sizes if not incremental else _moved_sizes(stored.sizes, diff, list(diff.sizes))
    changes = pa.concat_tables([_changes(work, diff.entered, "entered"), _changes(work, diff.exited, "exited")])
    clock.append(time.perf_counter())
    change_files = (
        write_files(work.changes_uri, PROFILE_SEGMENT_CHANGES, changes, work.tag, storage_options)
        if work.write_changes and changes.num_rows
        else []
    )
    counts = {
        "tenant": work.tenant,
        "mode": mode,
        "identities": profiles.size,
        "members": sum(sizes_now.values()),
        "entered": diff.entered.num_rows,
        "exited": diff.exited.num_rows,
    }
    clock.append(time.perf_counter())
    counts |= {f"seconds_{p}": b - a for p, a, b in zip(PHASES, clock, clock[1:])}
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
        for name in pairs["segment"].to_pylist():
            sizes[name] = sizes.get(name, 0) + weight
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
        for batch in batches:
            for index in batch.column(0).to_pylist():
                work = works[index]
                counts, sizes, held, change_files = evaluate_work(work, storage_options)
                yield from handoff("result", pa.Table.from_pylist([counts], schema=RESULT_SCHEMA))
                yield from handoff("sizes", sizes)
                yield from handoff("arrays", held.cast(ARRAYS_SCHEMA))
                files = [
                    {"tenant": work.tenant, "table": PROFILE_SEGMENT_CHANGES.name, "file": f.to_json()}
                    for f in change_files
                ]
                yield from handoff("files", pa.Table.from_pylist(files, schema=FILES_SCHEMA))

    return run
