"""File layout of a partitioned Delta table, and the upkeep that keeps it prunable (no Dagster).

Queries on engagement_activity name an org (the partition) and an engagement_date range, and delta-rs
skips every file whose [min, max] engagement_date misses the range. That only helps when each file
covers a narrow, distinct slice of dates. Small appends with interleaved dates give the opposite:
many small files that each span weeks, so a one-day query opens nearly all of them. The target is
the layout of Salesforce's engagement activity lake: few large (~1 GB) files per org whose date
ranges do not overlap.

Overlap of a partition's files, over their [min, max] ranges of the range column (in days):

    overlap_ratio = (sum of range lengths - length of their union) / sum of range lengths

in [0, 1): 0 when no two ranges share more than an end point (a date-sorted split, which is what
z-ordering on the date produces: neighbours may share their boundary day), near 1 when every file
spans the same dates. `max_depth` is the most files whose range contains one day: what a one-day
query must open at worst. Files without statistics are counted apart: no filter can skip them.

Concurrency: ingestion appends and mutation MERGEs/DELETEs commit while upkeep runs. delta-rs
rebases an OPTIMIZE over concurrent appends, but any concurrent commit that removes files (delete,
merge, another optimize) fails it with CommitFailedError, whatever partition it touched. Upkeep
commits one partition at a time, so a conflict costs only that partition: it is reported, the rows
stay in the files they were in (the failed commit changed nothing), and the next run retries it.

Vacuum deletes files removed from the table more than `vacuum_retention_hours` ago. A full vacuum
(the default) also deletes files the log never referenced once they are that old: the parquet
files of failed commits (an optimize conflict, an ingestion run killed mid-commit) and change-data
files of old commits. Readers of older versions, including change-data-feed readers of old commits
(changes.py), fail once their files are gone, so the retention must exceed the lag of the slowest
incremental reader and the longest write. Below the Delta default of 168 h, delta-rs' retention
check is turned off (our explicit setting wins). delta-rs reports an already-deleted file again on
later vacuums until its tombstone leaves the log, so `files_vacuumed` is an upper bound.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, WriterProperties
from deltalake.exceptions import CommitFailedError

from engagement_platform.lake.delta import DeltaLake, TableSpec

UPKEEP_APP_ID = "engagement.layout_upkeep"
DEFAULT_RETENTION_HOURS = 168  # Delta's default deletedFileRetentionDuration (7 days)
SMALL_FILE_FRACTION = 0.5  # a file below this share of the target size is "small"
ROW_GROUPS_PER_FILE = 16
MIN_ROW_GROUP_ROWS, MAX_ROW_GROUP_ROWS = 1024, 1024 * 1024


def range_overlap(intervals: Iterable[tuple[int, int]]) -> tuple[float, int]:
    """(overlap_ratio, depth) of inclusive integer ranges [lo, hi] (e.g. days since the epoch).

    overlap_ratio measures ranges as spans hi - lo, so ranges that only touch at an end point do not
    overlap, and a single-day range has length 0. depth is the most ranges containing one integer.
    """
    spans = sorted((int(lo), int(hi)) for lo, hi in intervals)
    if not spans:
        return 0.0, 0
    if any(hi < lo for lo, hi in spans):
        raise ValueError("every range needs lo <= hi")
    total = sum(hi - lo for lo, hi in spans)
    union = 0
    cur_lo, cur_hi = spans[0]
    for lo, hi in spans[1:]:
        if lo > cur_hi:
            union += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    union += cur_hi - cur_lo
    ratio = (total - union) / total if total else 0.0

    # Sweep: a range enters at lo and leaves after hi; at equal points leaving comes first.
    events = sorted([(lo, 1) for lo, _ in spans] + [(hi + 1, -1) for _, hi in spans])
    depth = covering = 0
    for _, step in events:
        covering += step
        depth = max(depth, covering)
    return ratio, depth


LAYOUT_SCHEMA_FIELDS = [
    ("files", pa.int64()),
    ("small_files", pa.int64()),
    ("files_without_stats", pa.int64()),
    ("rows", pa.int64()),
    ("total_bytes", pa.int64()),
    ("mean_file_bytes", pa.float64()),
    ("range_min", pa.int64()),  # cast to the range column's type in partition_layout
    ("range_max", pa.int64()),
    ("overlap_ratio", pa.float64()),
    ("max_depth", pa.int64()),
]


def partition_layout(
    lake: DeltaLake,
    table_name: str,
    partition_column: str = "org_id",
    range_column: str = "engagement_date",
    small_file_bytes: int | None = None,
    table: DeltaTable | None = None,
) -> pa.Table:
    """One row per partition value: files, small files, rows, bytes, mean file size, the range
    column's min/max, overlap_ratio and max_depth (see the module docstring), worst overlap first.

    Reads only the transaction log (per-file stats), never the data. `small_file_bytes` defaults to
    half the table's delta.targetFileSize. An absent table has an empty layout.
    """
    if table is None:
        if not lake.exists(table_name):
            return _layout_schema(partition_column, pa.date32()).empty_table()
        table = lake.table(table_name)
    if small_file_bytes is None:
        target = int(table.metadata().configuration.get("delta.targetFileSize", 100 * 1024 * 1024))
        small_file_bytes = int(target * SMALL_FILE_FRACTION)
    files = pa.table(table.get_add_actions(flatten=True))
    if files.num_rows == 0:
        return _layout_schema(partition_column, pa.date32()).empty_table()
    names = files.schema.names
    part = files[f"partition.{partition_column}"].to_pylist()
    size = files["size_bytes"].to_pylist()
    records = files["num_records"].to_pylist()
    has_stats = f"min.{range_column}" in names and f"max.{range_column}" in names
    range_type = files[f"min.{range_column}"].type if has_stats else pa.date32()
    lows = _days(files[f"min.{range_column}"]) if has_stats else [None] * files.num_rows
    highs = _days(files[f"max.{range_column}"]) if has_stats else [None] * files.num_rows

    groups: dict[str, list[int]] = {}
    for i, value in enumerate(part):
        groups.setdefault(value, []).append(i)
    rows = []
    for value, idx in groups.items():
        ranges = [(lo, hi) for i in idx if (lo := lows[i]) is not None and (hi := highs[i]) is not None]
        ratio, depth = range_overlap(ranges)
        total = sum(size[i] for i in idx)
        rows.append(
            {
                partition_column: value,
                "files": len(idx),
                "small_files": sum(size[i] < small_file_bytes for i in idx),
                "files_without_stats": len(idx) - len(ranges),
                "rows": sum(records[i] or 0 for i in idx),
                "total_bytes": total,
                "mean_file_bytes": total / len(idx),
                "range_min": min((lo for lo, _ in ranges), default=None),
                "range_max": max((hi for _, hi in ranges), default=None),
                "overlap_ratio": ratio,
                "max_depth": depth,
            }
        )
    rows.sort(key=lambda r: (-r["overlap_ratio"], -r["files"], r[partition_column] or ""))
    layout = pa.Table.from_pylist(rows, schema=_layout_schema(partition_column, pa.int64()))
    for name in ("range_min", "range_max"):  # back from day numbers to the column's own type
        i = layout.schema.get_field_index(name)
        layout = layout.set_column(i, pa.field(name, range_type), _from_days(layout[name], range_type))
    return layout


def _layout_schema(partition_column: str, range_type: pa.DataType) -> pa.Schema:
    fields = [(n, range_type if n in ("range_min", "range_max") else t) for n, t in LAYOUT_SCHEMA_FIELDS]
    return pa.schema([(partition_column, pa.string()), *fields])


def needs_upkeep(layout: pa.Table, max_overlap_ratio: float) -> list[str]:
    """Partitions worth rewriting: more than one small file, or overlap above the threshold.

    A z-ordered partition has at most one small file (the tail) and overlap 0, so a partition that
    nothing wrote to since the last upkeep is never rewritten again.
    """
    key = layout.schema.names[0]
    return [r[key] for r in layout.to_pylist() if r["small_files"] > 1 or r["overlap_ratio"] > max_overlap_ratio]


def upkeep(
    lake: DeltaLake,
    spec: TableSpec,
    partitions: Sequence[str] | None = None,
    target_file_bytes: int = 1024 * 1024 * 1024,
    z_order_columns: Sequence[str] = ("engagement_date",),
    vacuum_retention_hours: int = DEFAULT_RETENTION_HOURS,
    *,
    max_overlap_ratio: float = 0.1,
    vacuum_full: bool = True,
    vacuum_dry_run: bool = False,
) -> dict[str, Any]:
    """Z-order (which also compacts) every partition that needs it, one commit per partition, then vacuum.

    `partitions` limits the partitions considered (None = all). The first z-order column is the
    range column of the layout report (with more z-order columns the files are no longer sorted by
    it, so overlap may stay above the threshold: `partitions_unsettled` then lists them).

    Returns metrics: files and bytes before/after, partitions compacted / conflicted / unsettled,
    files added/removed, files vacuumed (and their paths), seconds per phase, and the layouts before
    and after (pyarrow tables, see `partition_layout`).
    """
    if len(spec.partition_by) != 1:
        raise ValueError(f"upkeep needs exactly one partition column, {spec.name} has {spec.partition_by}")
    column, range_column = spec.partition_by[0], z_order_columns[0]
    small = int(target_file_bytes * SMALL_FILE_FRACTION)
    started = time.perf_counter()
    table = lake.ensure(spec)
    version_before = table.version()
    before = partition_layout(lake, spec.name, column, range_column, small, table=table)
    wanted = needs_upkeep(before, max_overlap_ratio)
    if partitions is not None:
        allowed = set(partitions)
        wanted = [p for p in wanted if p in allowed]
    layout_s = time.perf_counter() - started

    started = time.perf_counter()
    compacted, conflicted, added, removed = [], [], 0, 0
    commit = CommitProperties(custom_metadata={"app_id": UPKEEP_APP_ID})
    bytes_per_row = {r[column]: r["total_bytes"] / max(r["rows"], 1) for r in before.to_pylist()}
    for value in wanted:
        try:
            metrics = table.optimize.z_order(
                list(z_order_columns),
                partition_filters=[(column, "=", value)],
                target_size=target_file_bytes,
                writer_properties=_writer_properties(target_file_bytes, bytes_per_row[value]),
                commit_properties=commit,
            )
        except CommitFailedError:
            # A concurrent delete/merge/optimize removed files since our snapshot. Nothing of ours
            # was committed; the partition stays as it is until the next run.
            conflicted.append(value)
            table.update_incremental()
            continue
        compacted.append(value)
        added += metrics["numFilesAdded"]
        removed += metrics["numFilesRemoved"]
    optimize_s = time.perf_counter() - started

    started = time.perf_counter()
    vacuum_conflict = False
    try:
        vacuumed = table.vacuum(
            retention_hours=vacuum_retention_hours,
            dry_run=vacuum_dry_run,
            enforce_retention_duration=vacuum_retention_hours >= DEFAULT_RETENTION_HOURS,
            full=vacuum_full,
            commit_properties=commit,
        )
    except CommitFailedError:
        # Only vacuum's own log entries failed to commit; files it deleted were unreferenced anyway.
        vacuumed, vacuum_conflict = [], True
    vacuum_s = time.perf_counter() - started

    table.update_incremental()
    after = partition_layout(lake, spec.name, column, range_column, small, table=table)
    # Rewritten but still "needing upkeep": the writer cannot do better at this target size, and
    # each run would rewrite these again. Expected empty; reported so a bad target shows up.
    unsettled = sorted(set(compacted) & set(needs_upkeep(after, max_overlap_ratio)))
    return {
        "table": spec.name,
        "version_before": version_before,
        "version_after": table.version(),
        "files_before": _sum(before, "files"),
        "files_after": _sum(after, "files"),
        "bytes_before": _sum(before, "total_bytes"),
        "bytes_after": _sum(after, "total_bytes"),
        "partitions_checked": before.num_rows,
        "partitions_compacted": compacted,
        "partitions_conflicted": conflicted,
        "partitions_unsettled": unsettled,
        "files_added": added,
        "files_removed": removed,
        "files_vacuumed": len(vacuumed),
        "vacuumed_paths": vacuumed,
        "vacuum_dry_run": vacuum_dry_run,
        "vacuum_conflict": vacuum_conflict,
        "seconds": {"layout": layout_s, "optimize": optimize_s, "vacuum": vacuum_s},
        "layout_before": before,
        "layout_after": after,
    }


def _from_days(column: pa.ChunkedArray, range_type: pa.DataType) -> pa.ChunkedArray:
    return column.cast(pa.int32()).cast(range_type) if pa.types.is_date32(range_type) else column.cast(range_type)


def _writer_properties(target_file_bytes: int, bytes_per_row: float) -> WriterProperties:
    """Row groups small enough that a file holds several of them.

    delta-rs closes an output file when its flushed (compressed) row groups plus the open row
    group's *uncompressed* size reach the target. With one big open row group, files come out at
    target / compression ratio, below the small-file line, and every run would rewrite them again.
    """
    rows = int(target_file_bytes / ROW_GROUPS_PER_FILE / max(bytes_per_row, 1.0))
    rows = min(max(rows, MIN_ROW_GROUP_ROWS), MAX_ROW_GROUP_ROWS)
    return WriterProperties(
        max_row_group_size=rows, compression="ZSTD", compression_level=4
    )  # delta-rs' optimize default codec


def _sum(layout: pa.Table, column: str) -> int:
    return int(pc.sum(layout[column]).as_py() or 0)


def _days(column: pa.ChunkedArray) -> list[int | None]:
    """Range-column stats as integers: days for dates, the value itself for integer columns."""
    if pa.types.is_date32(column.type):
        return column.cast(pa.int32()).to_pylist()
    if pa.types.is_integer(column.type):
        return column.to_pylist()
    raise TypeError(f"range column must be a date or an integer, not {column.type}")
