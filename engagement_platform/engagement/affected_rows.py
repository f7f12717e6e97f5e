"""The rows a batch of mutation requests can touch, read once with I/O pruning, and which of the
requests' external targets (ids and engagements the batch needs from the table) those rows hold.

The read keeps the files of the batch's org partitions (and, for an org whose every request is
date-bounded, only files whose engagement_date min/max stats meet the span), reads their key
columns, finds the rows holding an id or engagement of their org's requests with Arrow set lookups,
and reads only those rows whole (Dataset.take): a
pyarrow filter expression OR-ing one term per org was evaluated term by term on every batch of rows
(it took minutes for 1,000 orgs).
"""

from __future__ import annotations

from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from engagement_platform.engagement.mutation_request import OWNER_FIELDS
from engagement_platform.engagement.outcome_table import FIRST_DAY, _days
from engagement_platform.lake.delta import DeltaLake

KEY_COLUMNS = (*OWNER_FIELDS, "engagement_id")
_SEP = "\x1f"


def date_spans(requests: pa.Table) -> dict[str, tuple[date, date]]:
    """Org -> (earliest date_from, latest date_to) for orgs whose every request is date-bounded."""
    bounded = pc.and_(pc.is_valid(requests["date_from"]), pc.is_valid(requests["date_to"]))
    by_org = (requests.select(["org_id", "date_from", "date_to"]).append_column("bounded", bounded)
              .group_by("org_id").aggregate([("bounded", "all"), ("date_from", "min"), ("date_to", "max")]))
    spans = by_org.filter(pc.fill_null(by_org["bounded_all"], False))
    return {org: (lo, hi) for org, lo, hi in zip(spans["org_id"].to_pylist(), spans["date_from_min"].to_pylist(), spans["date_to_max"].to_pylist())}


def read_affected(lake: DeltaLake, name: str, version: int, schema: pa.Schema, requests: pa.Table,
                  keys: pa.Table) -> tuple[pa.Table, int, int]:
    """(rows any request of the batch may touch, files read, files in the table) at `version`.

    `requests`: the batch's requests (org_id, date_from, date_to); `keys`: (org_id, column, id) of
    every id and engagement they mention (hold_back.affected_keys)."""
    if version < 0 or requests.num_rows == 0:
        return schema.empty_table(), 0, 0
    dataset = lake.table(name, version).to_pyarrow_dataset()
    total = len(dataset.files)
    spans = date_spans(requests)
    open_orgs = sorted(set(pc.unique(requests["org_id"]).to_pylist()) - set(spans))
    fragments = list(dataset.get_fragments(filter=ds.field("org_id").isin(open_orgs))) if open_orgs else []
    for org, (lo, hi) in sorted(spans.items()):
        expr = (ds.field("org_id") == org) & (ds.field("engagement_date") >= lo) & (ds.field("engagement_date") <= hi)
        fragments += list(dataset.get_fragments(filter=expr))
    if not fragments:
        return schema.empty_table(), 0, total
    # Key columns first, then only the rows that match: the whole rows of 10M would not fit beside the rest.
    subset = ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)
    table = subset.to_table(columns=["org_id", "engagement_date", *KEY_COLUMNS])
    mask = np.zeros(table.num_rows, dtype=bool)
    for column in KEY_COLUMNS:
        of_column = keys.filter(pc.fill_null(pc.equal(keys["column"], column), False))
        if of_column.num_rows == 0:
            continue
        # Ids first (one hash lookup per row), then (org, id) pairs on the few candidates.
        candidates = np.flatnonzero(pc.fill_null(pc.is_in(table[column], value_set=pc.unique(of_column["id"])), False).to_numpy(zero_copy_only=False))
        if len(candidates) == 0:
            continue
        picked = table.select(["org_id", column]).take(pa.array(candidates))
        pairs = pc.binary_join_element_wise(picked["org_id"], picked[column], _SEP)
        wanted = pc.unique(pc.binary_join_element_wise(of_column["org_id"], of_column["id"], _SEP))
        mask[candidates[np.asarray(pc.fill_null(pc.is_in(pairs, value_set=wanted), False).to_numpy(zero_copy_only=False), dtype=bool)]] = True
    if spans:
        span_orgs = sorted(spans)
        at = np.asarray(pc.fill_null(pc.index_in(table["org_id"], value_set=pa.array(span_orgs)), -1).to_numpy(zero_copy_only=False), dtype=np.int64)
        spanned = at >= 0
        at = np.where(spanned, at, 0)
        day = _days(table["engagement_date"], FIRST_DAY)
        null_day = np.asarray(table["engagement_date"].is_null().to_numpy(zero_copy_only=False), dtype=bool)
        epoch = date(1970, 1, 1)
        lo = np.array([(spans[o][0] - epoch).days for o in span_orgs], dtype=np.int64)[at]
        hi = np.array([(spans[o][1] - epoch).days for o in span_orgs], dtype=np.int64)[at]
        mask &= ~spanned | (~null_day & (lo <= day) & (day <= hi))
    return subset.take(pa.array(np.flatnonzero(mask))), len(fragments), total
