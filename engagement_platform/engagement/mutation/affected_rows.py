"""The rows a batch of mutation requests can touch: which files to read (the driver plans, from the Delta
log's statistics) and which of their rows matter (each Spark task, over the files it read whole).

The plan keeps the files of the batch's org partitions and, for an org whose every request is
date-bounded, only files whose engagement_date min/max stats meet the span. A task reads each planned
file once, whole (it rewrites the files holding changed rows), and keeps the rows holding an id or
engagement of their org's requests (Arrow set lookups on the ids, then on (org, id) pairs): a pyarrow
filter expression OR-ing one term per org is evaluated term by term on every batch of rows, which is
slow with many orgs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.mutation.outcome_table import FIRST_DAY, epoch_days
from engagement_platform.engagement.mutation.requests import OWNER_FIELDS
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.file_writes import WrittenFile

KEY_COLUMNS = (*OWNER_FIELDS, "engagement_id")
_SEP = "\x1f"


@dataclass(frozen=True)
class FilePlan:
    """The files a batch reads, per org (as remove actions would name them), and how many the table has."""

    files_by_org: dict[str, list[WrittenFile]]
    files_total: int

    @property
    def files_read(self) -> int:
        return sum(len(f) for f in self.files_by_org.values())


def date_spans(requests: pa.Table) -> dict[str, tuple[date, date]]:
    """Org -> (earliest date_from, latest date_to) for orgs whose every request is date-bounded."""
    bounded = pc.and_(pc.is_valid(requests["date_from"]), pc.is_valid(requests["date_to"]))
    by_org = (
        requests.select(["org_id", "date_from", "date_to"])
        .append_column("bounded", bounded)
        .group_by("org_id")
        .aggregate([("bounded", "all"), ("date_from", "min"), ("date_to", "max")])
    )
    spans = by_org.filter(pc.fill_null(by_org["bounded_all"], False))
    return {
        org: (lo, hi)
        for org, lo, hi in zip(
            spans["org_id"].to_pylist(), spans["date_from_min"].to_pylist(), spans["date_to_max"].to_pylist()
        )
    }


def plan_files(lake: DeltaLake, name: str, version: int, requests: pa.Table) -> FilePlan:
    """The files of `name` at `version` that hold rows the requests (org_id, date_from, date_to) may touch,
    per org, from the log's partition values and engagement_date statistics (no data file is opened)."""
    if version < 0 or requests.num_rows == 0:
        return FilePlan({}, 0)
    actions = pa.table(lake.table(name, version).get_add_actions(flatten=True))
    total = actions.num_rows
    actions = actions.filter(pc.is_in(actions["partition.org_id"], value_set=pc.unique(requests["org_id"])))
    spans = date_spans(requests)
    by_org: dict[str, list[WrittenFile]] = {}
    no_stats = [None] * actions.num_rows
    low = actions["min.engagement_date"].to_pylist() if "min.engagement_date" in actions.column_names else no_stats
    high = actions["max.engagement_date"].to_pylist() if "max.engagement_date" in actions.column_names else no_stats
    for i, (path, size, modified, org) in enumerate(
        zip(
            actions["path"].to_pylist(),
            actions["size_bytes"].to_pylist(),
            actions["modification_time"].to_pylist(),
            actions["partition.org_id"].to_pylist(),
        )
    ):
        span = spans.get(org)
        if span is not None and low[i] is not None and high[i] is not None and (high[i] < span[0] or low[i] > span[1]):
            continue  # every request of the org is bounded and this file's dates miss their span
        by_org.setdefault(org, []).append(WrittenFile(path, size, {"org_id": org}, "", modified))
    return FilePlan(by_org, total)


def rows_holding(rows: pa.Table, keys: pa.Table, spans: dict[str, tuple[date, date]]) -> np.ndarray:
    """Per row: does it hold one of `keys` (org_id, column, id: hold_back.affected_keys) within its org's
    date span (date_spans; an org without one is unbounded)?"""
    return _holding(rows, keys) & _within_spans(rows, spans)


def _holding(table: pa.Table, keys: pa.Table) -> np.ndarray:
    """Per row: does it hold one of `keys` (org_id, column, id) in that column?"""
    mask = np.zeros(table.num_rows, dtype=bool)
    for column in KEY_COLUMNS:
        of_column = keys.filter(pc.fill_null(pc.equal(keys["column"], column), False))
        if of_column.num_rows == 0:
            continue
        # Ids first (one hash lookup per row), then (org, id) pairs on the few candidates.
        candidates = np.flatnonzero(
            pc.fill_null(pc.is_in(table[column], value_set=pc.unique(of_column["id"])), False).to_numpy(
                zero_copy_only=False
            )
        )
        if len(candidates) == 0:
            continue
        picked = table.select(["org_id", column]).take(pa.array(candidates))
        pairs = pc.binary_join_element_wise(picked["org_id"], picked[column], _SEP)
        wanted = pc.unique(pc.binary_join_element_wise(of_column["org_id"], of_column["id"], _SEP))
        mask[
            candidates[
                np.asarray(
                    pc.fill_null(pc.is_in(pairs, value_set=wanted), False).to_numpy(zero_copy_only=False), dtype=bool
                )
            ]
        ] = True
    return mask


def _within_spans(table: pa.Table, spans: dict[str, tuple[date, date]]) -> np.ndarray:
    """Per row: False where its org's requests are all date-bounded and its date is outside their span."""
    if not spans:
        return np.ones(table.num_rows, dtype=bool)
    span_orgs = sorted(spans)
    at = np.asarray(
        pc.fill_null(pc.index_in(table["org_id"], value_set=pa.array(span_orgs)), -1).to_numpy(zero_copy_only=False),
        dtype=np.int64,
    )
    spanned = at >= 0
    at = np.where(spanned, at, 0)
    day = epoch_days(table["engagement_date"], FIRST_DAY)
    null_day = np.asarray(table["engagement_date"].is_null().to_numpy(zero_copy_only=False), dtype=bool)
    epoch = date(1970, 1, 1)
    lo = np.array([(spans[o][0] - epoch).days for o in span_orgs], dtype=np.int64)[at]
    hi = np.array([(spans[o][1] - epoch).days for o in span_orgs], dtype=np.int64)[at]
    return ~spanned | (~null_day & (lo <= day) & (day <= hi))
