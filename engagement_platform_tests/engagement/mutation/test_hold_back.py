"""The column-wise hold-back (hold_back.py) against the rule it implements: cascade_fold.external_targets,
applied round by round with a row-by-row presence check, on random batches and tables."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import HealthCheck, given, settings

from engagement_platform.engagement.mutation.hold_back import hold_back, request_order, request_targets
from engagement_platform.engagement.mutation.reduction.fold import external_targets
from engagement_platform.engagement.mutation.request_columns import CANONICAL_SCHEMA
from engagement_platform.engagement.mutation.requests import in_date_range
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform_tests.support.reduction import canonical_rows, requests, tables


def reference(batch, rows) -> tuple[set[str], dict[str, list[dict]]]:
    """(request ids applied, held request id -> missing targets): the stream's former per-org loop."""
    active = sorted(batch, key=lambda r: r.order)
    by_id = {r.request_id: r for r in active}
    missing: dict[str, list[dict]] = {}
    while True:
        lost: dict[str, list[dict]] = {}
        for t in external_targets(active):
            r = by_id[t.request_id]
            column = "engagement_id" if t.kind == "engagement" else t.field
            if not any(
                row.get(column) == t.id and in_date_range(row["engagement_date"], r.date_from, r.date_to)
                for row in rows
            ):
                lost.setdefault(r.request_id, []).append({"kind": t.kind, "field": t.field, "id": t.id})
        if not lost:
            return {r.request_id for r in active}, missing
        missing.update(lost)
        active = [r for r in active if r.request_id not in lost]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), requests())
def test_hold_back_equals_the_round_by_round_rule(rows, batch):
    batch = list({r.request_id: r for r in batch}.values())  # the stream drops repeated request ids first
    table = pa.Table.from_pylist(canonical_rows(batch), schema=CANONICAL_SCHEMA)
    records = [r.record for r in batch]
    order = request_order(table)
    seq = order.argsort()
    needs, produces = request_targets(table, records)
    result = hold_back(table, needs, produces, seq, pa.Table.from_pylist(rows, schema=ENGAGEMENT_ACTIVITY.schema))

    applied, missing = reference(batch, rows)
    ids = table["request_id"].to_pylist()
    assert {ids[i] for i in range(len(ids)) if result.active[i]} == applied
    assert {ids[i]: found for i, found in result.missing.items()} == missing
    assert [ids[i] for i in result.held] == [i for i in missing]  # held in the order they were found
