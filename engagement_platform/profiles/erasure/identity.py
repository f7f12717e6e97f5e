"""Which ids a profile erasure removes, and which rows hold them (pure: no Spark, no Dagster, no I/O).

The rule: a person is their merged identity, so an erasure of one id removes the whole identity: every id
connected to the subject through the raw table's links (`related_ids`, the components the processor keeps)
and through the links of changes staged but not merged yet (the links the processor would add, which can
join two stored components). An id that appears nowhere is still suppressed: its later changes never land.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def identity_ids(subject: str, raw_rows: list[dict], staged_rows: list[dict]) -> set[str]:
    """The ids erased with `subject`: its connected component in the graph whose edges are every raw row's
    and every not-yet-merged staged change's links (primary_id <-> each related id). A staged change can
    join two stored components; the whole joined identity goes."""
    edges: dict[str, set[str]] = {}
    for row in (*raw_rows, *staged_rows):
        primary = row["primary_id"]
        for other in row.get("related_ids") or ():
            if other and other != primary:
                edges.setdefault(primary, set()).add(other)
                edges.setdefault(other, set()).add(primary)
    seen, frontier = {subject}, [subject]
    while frontier:
        for other in edges.get(frontier.pop(), ()):
            if other not in seen:
                seen.add(other)
                frontier.append(other)
    return seen


def naming_rows(rows: pa.Table, ids: set[str]) -> pa.Array:
    """Boolean mask of the rows whose primary id, or one of whose related / linked ids, is in `ids`."""
    value_set = pa.array(sorted(ids), pa.string())  # `rows` as the table's schema has them (plain strings)
    mask = pc.fill_null(pc.is_in(rows["primary_id"], value_set=value_set), False)
    for column in ("related_ids", "linked_ids"):
        if column in rows.column_names and rows.num_rows:
            lists = rows[column].combine_chunks()
            flat_hit = pc.fill_null(pc.is_in(pc.list_flatten(lists), value_set=value_set), False)
            parents = pc.list_parent_indices(lists)
            hit_rows = pc.unique(pc.filter(parents, flat_hit))
            listed = pc.is_in(pa.array(range(rows.num_rows), pa.int64()), value_set=pc.cast(hit_rows, pa.int64()))
            mask = pc.or_(mask, listed)
    return mask
