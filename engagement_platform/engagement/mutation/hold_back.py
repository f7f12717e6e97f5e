"""Which requests of a batch wait in the pending table, column-wise.

A request is held back when one of its external targets (an owner id or engagement no earlier request
of its org produced: reduction/fold.external_targets' rule) has no row in the table within the request's
date range. Holding a request back removes what it would have produced, so the org's targets are
looked at again until none is missing; a request that needed a held-back request's output is then
held back too, and a chain keeps its order.

Here the rule is one Arrow group-by and join over every request's targets instead of a Python scan
per org: a need (org, column, id) at position `seq` in the org's (request_time, request_id) order is
external iff no active request of the org produces (org, column, id) at a smaller seq.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.mutation.affected_rows import KEY_COLUMNS
from engagement_platform.engagement.mutation.outcome_table import FIRST_DAY, epoch_days, match_rows
from engagement_platform.engagement.mutation.request_columns import bool_mask, owner_ids_of_records

ENGAGEMENT = "engagement_id"


def request_order(requests: pa.Table) -> np.ndarray:
    """Row indices in (org_id, request_time, request_id) order: each org's requests in fold order."""
    return pc.sort_indices(
        requests, [("org_id", "ascending"), ("request_time", "ascending"), ("request_id", "ascending")]
    ).to_numpy()


def _part(requests: pa.Table, index: np.ndarray, column, ids, pos=None) -> pa.Table:
    n = len(index)
    take = pa.array(index)
    return pa.table(
        {
            "req": take,
            "org_id": requests["org_id"].take(take),
            "column": column if not isinstance(column, str) else pa.array([column] * n, pa.string()),
            "id": ids,
            "pos": pa.array(np.zeros(n, dtype=np.int64) if pos is None else pos),
        }
    )


def request_targets(requests: pa.Table, records: list) -> tuple[pa.Table, pa.Table]:
    """(needs, produces) of every request: tables of req (row), org_id, column, id, pos (order within
    the request). Needs are what external_targets checks; produces the positions a request fills.
    Requests with an empty date range take no part (the fold skips them)."""
    op = requests["op"]
    live = ~bool_mask(pc.greater(requests["date_from"], requests["date_to"]))
    convert = live & bool_mask(pc.equal(op, "convert"))
    merge = live & bool_mask(pc.equal(op, "merge"))
    update = live & bool_mask(pc.equal(op, "update"))
    by_engagement = live & bool_mask(pc.is_valid(requests["engagement_id"]))
    owner_delete = live & bool_mask(pc.equal(op, "delete")) & ~by_engagement

    def rows(mask):
        return np.flatnonzero(mask)

    def col(name, mask):
        return requests[name].take(pa.array(rows(mask)))

    # merge: each distinct from_id but the surviving id, in from_ids order
    m = rows(merge)
    listed = requests["from_ids"].take(pa.array(m))
    listed = listed.combine_chunks() if isinstance(listed, pa.ChunkedArray) else listed
    local = pc.list_parent_indices(listed).to_numpy()
    offsets = listed.offsets.to_numpy()
    merged = pa.table(
        {
            "req": pa.array(m[local], pa.int64()),
            "id": pc.list_flatten(listed),
            "pos": pa.array(np.arange(len(local)) + offsets[0] - offsets[local], pa.int64()),
        }
    )
    merged = merged.filter(
        pc.invert(pc.fill_null(pc.equal(merged["id"], requests["to_id"].take(merged["req"])), False))
    )
    first = (
        merged.append_column("k", pa.array(np.arange(merged.num_rows)))
        .group_by(["req", "id"])
        .aggregate([("k", "min")])["k_min"]
    )
    merged = merged.take(pa.array(np.sort(first.to_numpy())))
    needs = pa.concat_tables(
        [
            _part(requests, rows(convert), col("from_field", convert), col("from_id", convert)),
            _part(
                requests,
                merged["req"].to_numpy(),
                requests["field"].take(merged["req"]),
                merged["id"],
                merged["pos"].to_numpy(),
            ),
            _part(requests, rows(owner_delete), col("field", owner_delete), col("id", owner_delete)),
            _part(requests, rows(by_engagement), ENGAGEMENT, col("engagement_id", by_engagement)),
        ]
    )
    updated = [(i, name, value) for i, name, value in owner_ids_of_records(records) if update[i]]
    produces = pa.concat_tables(
        [
            _part(requests, rows(convert), col("to_field", convert), col("to_id", convert)),
            _part(requests, rows(merge), col("field", merge), col("to_id", merge)),
            _part(
                requests,
                np.array([i for i, _, _ in updated], dtype=np.int64),
                pa.array([n for _, n, _ in updated], pa.string()),
                pa.array([v for _, _, v in updated], pa.string()),
            ),
        ]
    )
    return needs, produces


@dataclass
class HoldBack:
    active: np.ndarray  # per request: applied in this batch
    held: list[int]  # requests held back, in the order they were found
    missing: dict[int, list[dict]]  # held request -> its missing targets {kind, field, id}
    rounds: int


def hold_back(requests: pa.Table, needs: pa.Table, produces: pa.Table, seq: np.ndarray, rows: pa.Table) -> HoldBack:
    """Hold back every request with a missing external target, then look again, until none is missing."""
    n = requests.num_rows
    active = np.ones(n, dtype=bool)
    held: list[int] = []
    missing_of: dict[int, list[dict]] = {}
    if n == 0:
        return HoldBack(active, held, missing_of, 0)
    need_req = needs["req"].to_numpy()
    need_seq = seq[need_req]
    is_engagement = bool_mask(pc.equal(needs["column"], ENGAGEMENT))
    present = _present(
        needs.append_column("date_from", requests["date_from"].take(needs["req"])).append_column(
            "date_to", requests["date_to"].take(needs["req"])
        ),
        rows,
    )
    produced = produces.append_column("seq", pa.array(seq[produces["req"].to_numpy()]))
    produce_req = produces["req"].to_numpy()
    org_codes = np.asarray(
        pc.dictionary_encode(requests["org_id"].combine_chunks()).indices.to_numpy(zero_copy_only=False), dtype=np.int64
    )
    todo = np.ones(org_codes.max() + 1, dtype=bool)
    rounds = 0
    while True:
        rounds += 1
        consider = active[need_req] & todo[org_codes[need_req]]
        live_produces = produced.filter(pa.array(active[produce_req] & todo[org_codes[produce_req]]))
        first = live_produces.group_by(["org_id", "column", "id"]).aggregate([("seq", "min")])
        index = np.flatnonzero(consider)
        looked = needs.select(["org_id", "column", "id"]).take(pa.array(index)).append_column("_n", pa.array(index))
        joined = looked.join(first, keys=["org_id", "column", "id"], join_type="left outer")
        at = joined["_n"].to_numpy()
        produced_before = (
            np.asarray(pc.fill_null(joined["seq_min"], np.iinfo(np.int64).max).to_numpy(zero_copy_only=False))
            < need_seq[at]
        )
        external = np.zeros(len(need_req), dtype=bool)
        external[at] = ~produced_before | is_engagement[at]
        missing = np.flatnonzero(external & ~present)
        if len(missing) == 0:
            break
        found = needs.take(pa.array(missing)).to_pylist()
        for need in sorted(found, key=lambda t: (seq[t["req"]], t["pos"])):
            req = need["req"]
            if req not in missing_of:
                held.append(req)
            kind = "engagement" if need["column"] == ENGAGEMENT else "owner"
            missing_of.setdefault(req, []).append(
                {"kind": kind, "field": None if kind == "engagement" else need["column"], "id": need["id"]}
            )
        newly = np.unique(need_req[missing])
        active[newly] = False
        todo[:] = False
        todo[org_codes[newly]] = True
    return HoldBack(active, held, missing_of, rounds)


def _present(needs: pa.Table, rows: pa.Table) -> np.ndarray:
    """Per need: does a row of its org hold the id in the column, on a day within the request's range?"""
    present = np.zeros(needs.num_rows, dtype=bool)
    if needs.num_rows == 0 or rows.num_rows == 0:
        return present
    day = epoch_days(rows["engagement_date"], FIRST_DAY)
    for column in KEY_COLUMNS:
        of_column = pc.equal(needs["column"], column)
        index = np.flatnonzero(bool_mask(of_column))
        if len(index):
            _, a = match_rows(rows, day, column, needs.filter(of_column), "id")
            present[index[a]] = True
    return present


def affected_keys(requests: pa.Table, needs: pa.Table, produces: pa.Table) -> pa.Table:
    """(org_id, column, id) of every id and engagement the batch mentions: the rows to read."""
    convert = np.flatnonzero(bool_mask(pc.equal(requests["op"], "convert")))
    take = pa.array(convert)
    # a convert also names its target id under the source field; rows holding it come out unchanged
    extra = pa.table(
        {
            "org_id": requests["org_id"].take(take),
            "column": requests["from_field"].take(take),
            "id": requests["to_id"].take(take),
        }
    )
    return pa.concat_tables(
        [needs.select(["org_id", "column", "id"]), produces.select(["org_id", "column", "id"]), extra]
    )
