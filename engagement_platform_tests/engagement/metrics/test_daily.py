"""Signed deltas of row-level changes, summed over any sequence of inserts, updates and deletes and in any
grouping of refreshes, equal the metrics grouped afresh from the final rows (the obvious reference)."""

from __future__ import annotations

from datetime import date, timedelta

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.engagement.metrics.daily import (
    METRICS_SCHEMA,
    add_deltas,
    daily_metrics,
    differences,
    metric_deltas,
)

COLUMNS = ("org_id", "engagement_date", "activity_type", "duration_seconds")
row_values = st.tuples(
    st.sampled_from(["o1", "o2"]),
    st.integers(0, 3).map(lambda d: date(2026, 1, 1) + timedelta(days=d)),
    st.sampled_from(["call", "meeting", "email_sent"]),
    st.none() | st.integers(0, 600),
)
operation = st.tuples(st.sampled_from(["insert", "update", "delete"]), st.integers(0, 9), row_values)


def as_table(rows: list[tuple], change_types: list[str] | None = None) -> pa.Table:
    columns = {c: [r[i] for r in rows] for i, c in enumerate(COLUMNS)}
    table = pa.table({**columns, "duration_seconds": pa.array(columns["duration_seconds"], pa.int32())})
    return (
        table.append_column("_change_type", pa.array(change_types, pa.string())) if change_types is not None else table
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=40), st.lists(st.integers(1, 8), min_size=1, max_size=10))
def test_folded_deltas_equal_a_recomputation_after_any_changes_in_any_refresh_grouping(operations, chunk_sizes):
    table: dict[int, tuple] = {}  # engagement id -> row: the table as the changes leave it
    changes: list[tuple[tuple, str]] = []
    for kind, key, values in operations:
        if kind == "insert" and key not in table:
            table[key] = values
            changes.append((values, "insert"))
        elif kind == "update" and key in table:
            changes += [(table[key], "update_preimage"), (values, "update_postimage")]
            table[key] = values
        elif kind == "delete" and key in table:
            changes.append((table.pop(key), "delete"))
    metrics, start, i = METRICS_SCHEMA.empty_table(), 0, 0
    while start < len(changes):  # refreshes of varying size, as notifications arrive
        chunk = changes[start : start + chunk_sizes[i % len(chunk_sizes)]]
        metrics = add_deltas(metrics, metric_deltas(as_table([r for r, _ in chunk], [t for _, t in chunk])))
        start, i = start + len(chunk), i + 1
    expected = daily_metrics(as_table(list(table.values())))
    assert differences(expected, metrics).num_rows == 0
    assert metrics.to_pylist() == expected.to_pylist()


def test_an_update_moving_a_row_to_another_day_moves_its_count():
    before = ("o1", date(2026, 1, 1), "call", 60)
    after = ("o1", date(2026, 1, 2), "call", 90)
    deltas = metric_deltas(as_table([before, after], ["update_preimage", "update_postimage"]))
    assert {(r["engagement_date"], r["activities"], r["duration_seconds"]) for r in deltas.to_pylist()} == {
        (date(2026, 1, 1), -1, -60),
        (date(2026, 1, 2), 1, 90),
    }


def test_an_unknown_change_type_is_an_error_not_a_silent_zero():
    with pytest.raises(ValueError, match="no sign"):
        metric_deltas(as_table([("o1", date(2026, 1, 1), "call", 1)], ["truncate"]))
