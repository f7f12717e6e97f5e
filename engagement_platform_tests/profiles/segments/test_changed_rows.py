"""Which identities an incremental evaluation takes up: the components of the raw rows that differ between the
files a slice's commits added and those they removed, found by pairing rows on their primary id, equal to plain
set arithmetic over whole rows (hypothesis), with repeated and null ids and null values too."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.profiles.segments.task import ROW_STATE, differing_components
from engagement_platform.profiles.tables import RAW_SCHEMA

STATE = pa.schema([RAW_SCHEMA.field(c) for c in ROW_STATE])
row_states = st.fixed_dictionaries(
    {
        "primary_id": st.sampled_from(["p1", "p2", "p3", "p4"]) | st.none(),
        "component_id": st.sampled_from(["c1", "c2", "c3"]) | st.none(),
        "cdc_seq": st.integers(0, 2) | st.none(),
        "deleted": st.booleans() | st.none(),
        "batch_id": st.integers(1, 2),
    }
)


def unique_ids(rows: list[dict]) -> list[dict]:
    """One row per primary id (the first), as a raw table's live files hold them."""
    first: dict[str, dict] = {}
    for r in rows:
        if r["primary_id"] is not None:
            first.setdefault(r["primary_id"], r)
    return list(first.values())


def reference(added: list[dict], removed: list[dict]) -> set[str]:
    old, new = ({tuple(r[c] for c in ROW_STATE) for r in rows} for rows in (removed, added))
    differ = [r for r in added if tuple(r[c] for c in ROW_STATE) not in old]
    differ += [r for r in removed if tuple(r[c] for c in ROW_STATE) not in new]
    return {r["component_id"] for r in differ if r["component_id"] is not None}


OTHER = {"component_id": "c9", "cdc_seq": 7, "batch_id": 3}  # values no strategy draws


def altered(row: dict, column: str | None) -> dict:
    """The row with one column's value changed (None: as it is)."""
    if column is None:
        return row
    return {**row, column: (not row["deleted"]) if column == "deleted" else OTHER[column]}


@settings(max_examples=400, deadline=None)
@given(
    added=st.lists(row_states, max_size=8),
    removed=st.lists(row_states, max_size=8),
    rewritten=st.lists(st.sampled_from([None, "deleted", *OTHER]), max_size=8),
    as_a_raw_table=st.booleans(),
)
def test_changed_components_are_those_of_rows_without_an_equal_row_on_the_other_side(
    added, removed, rewritten, as_a_raw_table
):
    # the rows a rewrite removed: some of the added rows as they were (one column different, or none:
    # copied unchanged), and others
    removed = [altered(r, column) for r, column in zip(added, rewritten)] + removed
    if as_a_raw_table:  # each side one row per primary id: the rows pair up by it
        added, removed = unique_ids(added), unique_ids(removed)
    got = differing_components(pa.Table.from_pylist(added, schema=STATE), pa.Table.from_pylist(removed, schema=STATE))
    assert sorted(got.to_pylist()) == sorted(reference(added, removed))
