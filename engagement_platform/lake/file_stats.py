"""Delta's per-file statistics (numRecords, min/max, null counts) of the files a writer makes, computed for
every partition of a write at once: a call per file and column costs more than a small file's data."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import UTC, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

MAX_STAT_CHARS = 256  # longer string bounds are left out of the stats (the column is then not skipped on)


def delta_stats(rows: pa.Table, columns: Iterable[str]) -> str:
    """Delta's per-file statistics of `rows` for `columns` (dates as YYYY-MM-DD, timestamps as UTC ISO with
    milliseconds: the minimum floored and the maximum rounded up, so a bound never excludes a row)."""
    return next(iter(partition_stats(rows, [], columns).values()), _stats_json(0, {}, {}, {}))


def partition_stats(rows: pa.Table, partition_by: list[str], columns: Iterable[str]) -> dict[tuple, str]:
    """delta_stats of each partition's rows, keyed by its partition values (as Python values): one hash
    aggregation over all partitions, since a call per file and column costs more than a small file's data."""
    columns = list(columns)
    bounded = [c for c in columns if _has_bounds(rows[c].type)]
    aggregates = [(c, "min_max") for c in bounded] + [(c, "count", pc.CountOptions("only_null")) for c in columns]
    out = {}
    grouped = rows.group_by(partition_by, use_threads=False).aggregate([*aggregates, ([], "count_all")])
    for found in grouped.to_pylist():
        key = tuple(found[c] for c in partition_by)
        nulls = {c: found[f"{c}_count"] for c in columns}
        count = found["count_all"]
        mins, maxs = {}, {}
        for name in bounded:
            bounds = found[f"{name}_min_max"]
            if nulls[name] == count:
                continue
            type_ = rows[name].type
            low, high = _json_bound(bounds["min"], type_, up=False), _json_bound(bounds["max"], type_, up=True)
            if low is not None and high is not None:
                mins[name], maxs[name] = low, high
        out[key] = _stats_json(count, mins, maxs, nulls)
    return out


def _stats_json(count: int, mins: dict, maxs: dict, nulls: dict) -> str:
    return json.dumps(
        {"numRecords": count, "minValues": mins, "maxValues": maxs, "nullCount": nulls}, separators=(",", ":")
    )


def _has_bounds(type_: pa.DataType) -> bool:
    return (
        pa.types.is_integer(type_)
        or pa.types.is_floating(type_)
        or pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_date32(type_)
        or pa.types.is_timestamp(type_)
    )


def _json_bound(value: Any, type_: pa.DataType, up: bool) -> Any:
    if value is None:
        return None
    if pa.types.is_floating(type_):
        return None if math.isnan(value) or math.isinf(value) else value
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return value if len(value) <= MAX_STAT_CHARS else None
    if pa.types.is_date32(type_):
        return value.isoformat()
    if pa.types.is_timestamp(type_):
        stamp = value if value.tzinfo else value.replace(tzinfo=UTC)
        stamp = stamp.astimezone(UTC)
        floored = stamp.replace(microsecond=stamp.microsecond // 1000 * 1000)
        if up and floored != stamp:
            floored += timedelta(milliseconds=1)
        return floored.strftime("%Y-%m-%dT%H:%M:%S.") + f"{floored.microsecond // 1000:03d}Z"
    return value
