"""The rows a batch of mutation requests can touch, read once with I/O pruning.

The read keeps the files of the batch's org partitions (and, for an org whose every request is
date-bounded, only files whose engagement_date min/max stats meet the span), then reads them whole,
a chunk of files at a time, and keeps the rows holding an id or engagement of their org's requests
(Arrow set lookups on the ids, then on (org, id) pairs). Reading the key columns first and then the
matching rows with Dataset.take would read every file twice, and a pyarrow filter expression OR-ing
one term per org is evaluated term by term on every batch of rows, which is slow with many orgs.
"""

from __future__ import annotations

from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from engagement_platform.engagement.mutation.requests import OWNER_FIELDS
from engagement_platform.engagement.mutation.outcome_table import FIRST_DAY, epoch_days
from engagement_platform.lake.delta import DeltaLake

KEY_COLUMNS = (*OWNER_FIELDS, "engagement_id")
_SEP = "\x1f"
CHUNK_FILES = 256  # files read (whole rows) at a time: bounds the memory to a chunk, not the table


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
    # One pass over whole rows, a chunk of files at a time: each chunk keeps the rows holding a key of its
    # orgs. (Reading the key columns, then Dataset.take of the matches, read every file twice.)
    fragments.sort(key=lambda f: ds.get_partition_keys(f.partition_expression).get("org_id") or "")
    keys = keys.sort_by("org_id")
    runs = pc.run_end_encode(keys["org_id"].combine_chunks())
    ends = runs.run_ends.to_numpy()
    key_rows = {org: (int(start), int(end)) for org, start, end in zip(runs.values.to_pylist(), np.concatenate([[0], ends[:-1]]), ends)}
    parts = []
    for at in range(0, len(fragments), CHUNK_FILES):
        chunk = ds.FileSystemDataset(fragments[at:at + CHUNK_FILES], dataset.schema, dataset.format, dataset.filesystem).to_table()
        orgs = pc.unique(chunk["org_id"]).to_pylist()
        of_orgs = pa.concat_tables([keys.slice(key_rows[o][0], key_rows[o][1] - key_rows[o][0]) for o in orgs if o in key_rows] or [keys.slice(0, 0)])
        parts.append(chunk.filter(pa.array(_holding(chunk, of_orgs) & _within_spans(chunk, spans))))
    return pa.concat_tables(parts), len(fragments), total


def _holding(table: pa.Table, keys: pa.Table) -> np.ndarray:
    """Per row: does it hold one of `keys` (org_id, column, id) in that column?"""
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
    return mask


def _within_spans(table: pa.Table, spans: dict[str, tuple[date, date]]) -> np.ndarray:
    """Per row: False where its org's requests are all date-bounded and its date is outside their span."""
    if not spans:
        return np.ones(table.num_rows, dtype=bool)
    span_orgs = sorted(spans)
    at = np.asarray(pc.fill_null(pc.index_in(table["org_id"], value_set=pa.array(span_orgs)), -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    spanned = at >= 0
    at = np.where(spanned, at, 0)
    day = epoch_days(table["engagement_date"], FIRST_DAY)
    null_day = np.asarray(table["engagement_date"].is_null().to_numpy(zero_copy_only=False), dtype=bool)
    epoch = date(1970, 1, 1)
    lo = np.array([(spans[o][0] - epoch).days for o in span_orgs], dtype=np.int64)[at]
    hi = np.array([(spans[o][1] - epoch).days for o in span_orgs], dtype=np.int64)[at]
    return ~spanned | (~null_day & (lo <= day) & (day <= hi))
