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

from engagement_platform.engagement.mutation_request import OWNER_FIELDS, MutationRequest
from engagement_platform.engagement.outcome_table import FIRST_DAY, _days, match_rows
from engagement_platform.engagement.reduction import ExternalTarget
from engagement_platform.lake.delta import DeltaLake

KEY_COLUMNS = (*OWNER_FIELDS, "engagement_id")
_SEP = "\x1f"


def request_keys(request: MutationRequest) -> list[tuple[str, str]]:
    """Every (column, id) a request mentions: owner ids it reads or writes, the engagement it targets."""
    keys = [(name, value) for name, value in ((request.field, request.owner_id), (request.to_field, request.to_id), (request.field, request.to_id))
            if name is not None and value is not None]
    keys += [(request.field, i) for i in request.from_ids]
    if request.record:
        keys += [(n, request.record[n]) for n in OWNER_FIELDS if request.record.get(n) is not None]
    if request.engagement_id:
        keys.append(("engagement_id", request.engagement_id))
    return keys


def date_spans(requests_by_org: dict[str, list[MutationRequest]]) -> dict[str, tuple[date, date]]:
    """Org -> (earliest date_from, latest date_to) for orgs whose every request is date-bounded."""
    return {org: (min(r.date_from for r in rs), max(r.date_to for r in rs)) for org, rs in requests_by_org.items()
            if rs and all(r.date_from is not None and r.date_to is not None for r in rs)}


def read_affected(lake: DeltaLake, name: str, version: int, schema: pa.Schema,
                  requests_by_org: dict[str, list[MutationRequest]]) -> tuple[pa.Table, int, int]:
    """(rows any request of the batch may touch, files read, files in the table) at `version`."""
    if version < 0 or not requests_by_org:
        return schema.empty_table(), 0, 0
    dataset = lake.table(name, version).to_pyarrow_dataset()
    total = len(dataset.files)
    spans = date_spans(requests_by_org)
    open_orgs = sorted(o for o in requests_by_org if o not in spans)
    fragments = list(dataset.get_fragments(filter=ds.field("org_id").isin(open_orgs))) if open_orgs else []
    for org, (lo, hi) in sorted(spans.items()):
        expr = (ds.field("org_id") == org) & (ds.field("engagement_date") >= lo) & (ds.field("engagement_date") <= hi)
        fragments += list(dataset.get_fragments(filter=expr))
    if not fragments:
        return schema.empty_table(), 0, total
    # Key columns first, then only the rows that match: the whole rows of 10M would not fit beside the rest.
    subset = ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)
    table = subset.to_table(columns=["org_id", "engagement_date", *KEY_COLUMNS])
    keys: dict[str, tuple[list[str], list[str]]] = {c: ([], []) for c in KEY_COLUMNS}
    for org, requests in requests_by_org.items():
        for request in requests:
            for column, value in request_keys(request):
                keys[column][0].append(org)
                keys[column][1].append(value)
    mask = np.zeros(table.num_rows, dtype=bool)
    for column, (orgs, ids) in keys.items():
        if not ids:
            continue
        # Ids first (one hash lookup per row), then (org, id) pairs on the few candidates.
        candidates = np.flatnonzero(pc.fill_null(pc.is_in(table[column], value_set=pa.array(sorted(set(ids)))), False).to_numpy(zero_copy_only=False))
        if len(candidates) == 0:
            continue
        picked = table.select(["org_id", column]).take(pa.array(candidates))
        pairs = pc.binary_join_element_wise(picked["org_id"], picked[column], _SEP)
        wanted = pa.array(sorted({o + _SEP + i for o, i in zip(orgs, ids)}))
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


def present_targets(targets: list[tuple[str, ExternalTarget, MutationRequest]], rows: pa.Table) -> np.ndarray:
    """Per (org, target, its request): does a row of the org hold the target within the request's date range?"""
    present = np.zeros(len(targets), dtype=bool)
    if not targets or rows.num_rows == 0:
        return present
    day = _days(rows["engagement_date"], FIRST_DAY)
    table = pa.table({
        "org_id": pa.array([org for org, _, _ in targets], pa.string()),
        "column": pa.array(["engagement_id" if t.kind == "engagement" else t.field for _, t, _ in targets], pa.string()),
        "id": pa.array([t.id for _, t, _ in targets], pa.string()),
        "date_from": pa.array([r.date_from for _, _, r in targets], pa.date32()),
        "date_to": pa.array([r.date_to for _, _, r in targets], pa.date32()),
    })
    for column in KEY_COLUMNS:
        of_column = pc.equal(table["column"], column)
        index = np.flatnonzero(np.asarray(of_column.to_numpy(zero_copy_only=False), dtype=bool))
        if len(index):
            _, a = match_rows(rows, day, column, table.filter(of_column), "id")
            present[index[a]] = True
    return present
