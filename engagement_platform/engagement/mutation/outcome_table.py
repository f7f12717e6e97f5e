"""The MERGE source of a batch, column-wise: what every read row becomes under the reduced actions.

The same function as row_outcome.reduced_row, computed with Arrow joins and numpy masks over all
orgs at once instead of a Python call per row. Inputs are reduction/arrow.py's flat action rows (from
the driver's fold or from the Spark groups). Rows whose ids crossed fields twice or more (two of
their owner ids moving, which needs settle_owners' ordered replay) are the only ones settled in
Python, one call each; with at most one moving id a row's outcome is a closed formula:

- an id that moves erases, at its first move into a field g, the id sitting in g; an erased id's
  later delete no longer applies, and it leaves no value;
- the row is deleted at the earliest delete that still applies; it then takes its engagement's
  first branch whose date range holds its date if that branch comes before the delete.
"""

from __future__ import annotations

import json
from datetime import date, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.mutation.reduction.model import OwnerFate
from engagement_platform.engagement.mutation.reduction.row_outcome import settle_owners
from engagement_platform.engagement.mutation.requests import DELETE, OWNER_FIELDS, REPLACE

INF = np.iinfo(np.int64).max
FIRST_DAY = (date.min - date(1970, 1, 1)).days  # a null engagement_date counts as 0001-01-01
ACTION = "_action"  # MERGE source column: update | delete
UPDATE = "update"


def epoch_days(column, null: int) -> np.ndarray:
    """A date column as days since 1970-01-01 (int64), nulls as `null`."""
    return np.asarray(pc.fill_null(pc.cast(column, pa.int32()), null).to_numpy(zero_copy_only=False), dtype=np.int64)


def _ints(column) -> np.ndarray:
    return np.asarray(pc.fill_null(column, INF).to_numpy(zero_copy_only=False), dtype=np.int64)


def _in_range(day: np.ndarray, date_from, date_to) -> np.ndarray:
    return (epoch_days(date_from, FIRST_DAY) <= day) & (day <= epoch_days(date_to, 2**31 - 1))


def match_rows(
    rows: pa.Table, day: np.ndarray, key: str, actions: pa.Table, action_key: str
) -> tuple[np.ndarray, np.ndarray]:
    """(row index, action index) of every action on (org_id, the row's `key`) whose date range holds the row's date."""
    left = pa.table({"_i": pa.array(np.arange(rows.num_rows)), "org_id": rows["org_id"], "_k": rows[key]}).filter(
        pc.is_valid(rows[key])
    )
    right = pa.table(
        {
            "org_id": actions["org_id"],
            "_k": actions[action_key],
            "_a": pa.array(np.arange(actions.num_rows)),
            "date_from": actions["date_from"],
            "date_to": actions["date_to"],
        }
    )
    joined = left.join(right, keys=["org_id", "_k"], join_type="inner")
    i, a = joined["_i"].to_numpy(), joined["_a"].to_numpy()
    ok = _in_range(day[i], joined["date_from"], joined["date_to"])
    return i[ok], a[ok]


def _first_moves(moves: list[str | None]) -> dict[str, np.ndarray]:
    """Per field g: the seq of each action's first move into g (INF if it never moves there)."""
    first = {g: np.full(len(moves), INF, dtype=np.int64) for g in OWNER_FIELDS}
    for a, text in enumerate(moves):
        if text is not None:
            for seq, to_field in reversed(json.loads(text)):
                first[to_field][a] = seq
    return first


def _typed(record: dict, schema: pa.Schema) -> dict:
    out = {}
    for name, value in record.items():
        type_ = schema.field(name).type
        if isinstance(value, str) and pa.types.is_date(type_):
            value = date.fromisoformat(value)
        elif isinstance(value, str) and pa.types.is_timestamp(type_):
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        out[name] = value
    return out


def _differs(a, b) -> np.ndarray:
    equal = pc.fill_null(pc.equal(a, b), False)
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return np.asarray(pc.invert(pc.or_(equal, both_null)).to_numpy(zero_copy_only=False), dtype=bool)


def outcome_table(rows: pa.Table, actions: pa.Table) -> tuple[pa.Table, dict[str, int]]:
    """(MERGE source: changed rows + `_action` (update | delete), counts updated/replaced/deleted/unchanged).

    `rows`: the rows any action may touch (extra rows are fine: they come out unchanged);
    `actions`: reduction/arrow.py rows of kind owner and engagement for every org of the batch."""
    schema = rows.schema
    n = rows.num_rows
    out_schema = schema.append(pa.field(ACTION, pa.string()))
    if n == 0:
        return out_schema.empty_table(), {"updated": 0, "replaced": 0, "deleted": 0, "unchanged": 0}
    day = epoch_days(rows["engagement_date"], FIRST_DAY)
    kind = actions["kind"]
    owner = actions.filter(pc.equal(kind, "owner"))
    branches = actions.filter(pc.equal(kind, "engagement"))

    # -- owner fates: the action index per row and field (-1: none)
    deleted_at = _ints(owner["deleted_at"])
    moves = owner["moves"].to_pylist()
    moving = np.array([m is not None for m in moves], dtype=bool)
    first_move = _first_moves(moves)
    fate = {}
    for f in OWNER_FIELDS:
        idx = np.full(n, -1, dtype=np.int64)
        of_field = pc.equal(owner["field"], f)
        if pc.any(of_field).as_py():
            sub_index = np.flatnonzero(np.asarray(of_field.to_numpy(zero_copy_only=False), dtype=bool))
            i, a = match_rows(rows, day, f, owner.filter(of_field), "id")
            idx[i] = sub_index[a]
        fate[f] = idx
    has = {f: fate[f] >= 0 for f in OWNER_FIELDS}
    safe = {f: np.where(has[f], fate[f], 0) for f in OWNER_FIELDS}
    mov = {f: has[f] & moving[safe[f]] if len(moving) else np.zeros(n, dtype=bool) for f in OWNER_FIELDS}
    n_moving = sum(mov[f].astype(np.int64) for f in OWNER_FIELDS)
    present = {f: np.asarray(rows[f].is_valid().to_numpy(zero_copy_only=False), dtype=bool) for f in OWNER_FIELDS}

    # -- at most one moving id: erasures, the delete that applies, the new owner columns
    mover_index = np.full(n, -1, dtype=np.int64)  # the moving id's action per row
    for f in OWNER_FIELDS:
        mover_index = np.where(mov[f], fate[f], mover_index)
    has_mover = mover_index >= 0
    mover_safe = np.where(has_mover, mover_index, 0)
    row_deleted = np.full(n, INF, dtype=np.int64)
    owners = {f: rows[f] for f in OWNER_FIELDS}
    erased = {}
    for f in OWNER_FIELDS:
        erased_at = np.where(has_mover & ~mov[f], first_move[f][mover_safe], INF) if len(moving) else np.full(n, INF)
        erased[f] = present[f] & ~mov[f] & (erased_at < INF)
        own_delete = np.where(has[f], deleted_at[safe[f]] if len(deleted_at) else INF, INF)
        row_deleted = np.minimum(row_deleted, np.where(own_delete < erased_at, own_delete, INF))
    new_field = owner["new_field"].take(pa.array(mover_safe)) if owner.num_rows else pa.nulls(n, pa.string())
    for f in OWNER_FIELDS:  # ids without a move: renamed in place, or erased by the moving id
        renamed = has[f] & ~mov[f]
        if renamed.any():
            owners[f] = pc.if_else(pa.array(renamed), owner["new_id"].take(pa.array(safe[f])), owners[f])
        leaves = mov[f] | erased[f]
        if leaves.any():
            owners[f] = pc.if_else(pa.array(leaves), pa.nulls(n, pa.string()), owners[f])
    if has_mover.any():
        new_id = owner["new_id"].take(pa.array(mover_safe))
        for g in OWNER_FIELDS:  # then the moving id lands in its final field
            lands = has_mover & np.asarray(
                pc.fill_null(pc.equal(new_field, g), False).to_numpy(zero_copy_only=False), dtype=bool
            )
            if lands.any():
                owners[g] = pc.if_else(pa.array(lands), new_id, owners[g])

    # -- rows with two or more moving ids: settle_owners' ordered replay, one call per row
    tangled = np.flatnonzero(n_moving >= 2)
    if len(tangled):
        values = {f: owners[f].to_pylist() for f in OWNER_FIELDS}
        original = rows.select(list(OWNER_FIELDS)).take(pa.array(tangled)).to_pylist()
        fates_cols = {c: owner[c].to_pylist() for c in ("deleted_at", "new_field", "new_id")}
        for row_index, row in zip(tangled, original):
            fates = {}
            for f in OWNER_FIELDS:
                if has[f][row_index]:
                    a = fate[f][row_index]
                    steps = tuple(tuple(m) for m in json.loads(moves[a] or "[]"))
                    fates[f] = OwnerFate(
                        fates_cols["deleted_at"][a], fates_cols["new_field"][a], fates_cols["new_id"][a], steps
                    )
            seq, final = settle_owners(row, fates)
            row_deleted[row_index] = INF if seq is None else seq
            for f in OWNER_FIELDS:
                values[f][row_index] = final.get(f)
        owners = {f: pa.array(values[f], pa.string()) for f in OWNER_FIELDS}

    # -- engagement branches: the first whose range holds the row's date, if it precedes the delete
    branch = np.full(n, -1, dtype=np.int64)
    replace_ids = np.zeros(n, dtype=bool)
    if branches.num_rows:
        seqs = _ints(branches["seq"])
        is_replace = np.asarray(pc.equal(branches["action"], REPLACE).to_numpy(zero_copy_only=False), dtype=bool)
        all_i, all_a = match_rows(
            rows,
            np.zeros(n, dtype=np.int64),
            "engagement_id",
            branches.set_column(
                branches.schema.get_field_index("date_from"), "date_from", pa.nulls(branches.num_rows, pa.date32())
            ).set_column(
                branches.schema.get_field_index("date_to"), "date_to", pa.nulls(branches.num_rows, pa.date32())
            ),
            "engagement_id",
        )
        replace_ids[all_i[is_replace[all_a]]] = True  # counted as replaced whenever the engagement has a replace branch
        i, a = match_rows(rows, day, "engagement_id", branches, "engagement_id")
        order = np.lexsort((seqs[a], i))
        i, a = i[order], a[order]
        firsts = np.unique(i, return_index=True)[1]
        i, a = i[firsts], a[firsts]
        takes = seqs[a] < row_deleted[i]
        branch[i[takes]] = a[takes]
    taken = branch >= 0
    branch_safe = np.where(taken, branch, 0)
    branch_deletes = taken & (
        np.asarray(pc.equal(branches["action"], DELETE).to_numpy(zero_copy_only=False), dtype=bool)[branch_safe]
        if branches.num_rows
        else False
    )
    deleted = np.where(taken, branch_deletes, row_deleted < INF)
    replaced = taken & ~branch_deletes

    # -- changed rows only
    kept = ~deleted & ~replaced
    changed = np.zeros(n, dtype=bool)
    for f in OWNER_FIELDS:
        changed |= _differs(owners[f], rows[f])
    updated = np.flatnonzero(kept & changed)
    parts = []
    deleted_rows = np.flatnonzero(deleted)
    if len(deleted_rows):
        part = rows.take(pa.array(deleted_rows))
        parts.append(part.append_column(ACTION, pa.array([DELETE] * len(deleted_rows), pa.string())))
    if len(updated):
        take = pa.array(updated)
        part = rows.take(take)
        for f in OWNER_FIELDS:
            part = part.set_column(schema.get_field_index(f), f, owners[f].take(take))
        parts.append(part.append_column(ACTION, pa.array([UPDATE] * len(updated), pa.string())))
    replaced_rows = np.flatnonzero(replaced)
    counts = {"updated": 0, "replaced": 0, "deleted": len(deleted_rows), "unchanged": 0}
    replacements = []
    if len(replaced_rows):
        records = branches["record"].take(pa.array(branch[replaced_rows])).to_pylist()
        for row, text in zip(rows.take(pa.array(replaced_rows)).to_pylist(), records):
            new = {**row, **_typed(json.loads(text), schema)}
            if new == row:
                counts["unchanged"] += 1
            else:
                replacements.append({**new, ACTION: UPDATE})
    for is_replace in replace_ids[updated]:
        counts["replaced" if is_replace else "updated"] += 1
    counts["replaced"] += len(replacements)
    counts["unchanged"] += int((kept & ~changed).sum())
    if replacements:
        parts.append(pa.Table.from_pylist(replacements, schema=out_schema))
    source = pa.concat_tables([p.cast(out_schema) for p in parts]) if parts else out_schema.empty_table()
    return source, counts
