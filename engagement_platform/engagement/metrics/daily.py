"""Daily engagement metrics per org, day and activity type, kept up to date from row-level changes.

Pure logic (Arrow in, Arrow out). An aggregate of a mutable table cannot be refreshed from inserts alone:
an ID mutation's `update` can move a row to another day or activity type, and erasure and TTL delete rows.
So each changed row counts with a sign, +1 for `insert` and `update_postimage`, -1 for `delete` and
`update_preimage`, and the refresh adds the signed sums to the stored metrics. Summed over any sequence of
changes this equals grouping the table's rows afresh (`daily_metrics`), which the asset check compares.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

KEYS = ("org_id", "engagement_date", "activity_type")
MEASURES = ("activities", "duration_seconds")
SIGNS = {"insert": 1, "update_postimage": 1, "update_preimage": -1, "delete": -1}
CHANGE_TYPE = "_change_type"
METRICS_SCHEMA = pa.schema(
    [
        ("org_id", pa.string()),
        ("engagement_date", pa.date32()),
        ("activity_type", pa.string()),
        ("activities", pa.int64()),
        ("duration_seconds", pa.int64()),
    ]
)


def metric_deltas(changes: pa.Table) -> pa.Table:
    """The changes' signed contribution per (org, day, activity type), keys whose contributions cancel left out."""
    if not changes.num_rows:
        return METRICS_SCHEMA.empty_table()
    change_type = changes[CHANGE_TYPE].cast(pa.string())
    unknown = set(pc.unique(change_type).to_pylist()) - set(SIGNS)
    if unknown:
        raise ValueError(f"change types {sorted(unknown, key=str)} have no sign: metrics cannot be folded from them")
    removes = pc.is_in(change_type, pa.array([t for t, sign in SIGNS.items() if sign < 0]))
    sign = pc.if_else(removes, pa.scalar(-1, pa.int64()), pa.scalar(1, pa.int64()))
    duration = pc.fill_null(changes["duration_seconds"].cast(pa.int64()), 0)
    signed = pa.table(
        {
            **{k: changes[k].cast(METRICS_SCHEMA.field(k).type) for k in KEYS},
            "activities": sign,
            "duration_seconds": pc.multiply(sign, duration),
        }
    )
    return _summed(signed)


def daily_metrics(rows: pa.Table) -> pa.Table:
    """Full recomputation from the table's rows: the reference the incremental metrics must equal."""
    counted = pa.table(
        {
            **{k: rows[k].cast(METRICS_SCHEMA.field(k).type) for k in KEYS},
            "activities": pa.array([1] * rows.num_rows, pa.int64()),
            "duration_seconds": pc.fill_null(rows["duration_seconds"].cast(pa.int64()), 0),
        }
    )
    return _summed(counted)


def add_deltas(metrics: pa.Table, deltas: pa.Table) -> pa.Table:
    """Stored metrics plus deltas (what the table's MERGE computes), keys at zero activities dropped."""
    return _summed(
        pa.concat_tables([metrics.select(METRICS_SCHEMA.names).cast(METRICS_SCHEMA), deltas.cast(METRICS_SCHEMA)])
    )


def differences(expected: pa.Table, actual: pa.Table) -> pa.Table:
    """Keys whose measures differ between two metrics tables (missing on one side counts as zero)."""
    negated = actual.select(METRICS_SCHEMA.names).cast(METRICS_SCHEMA)
    negated = negated.set_column(3, "activities", pc.negate(negated["activities"]))
    negated = negated.set_column(4, "duration_seconds", pc.negate(negated["duration_seconds"]))
    diff = pa.concat_tables([expected.select(METRICS_SCHEMA.names).cast(METRICS_SCHEMA), negated])
    grouped = _grouped_sums(diff)
    return grouped.filter(pc.or_(pc.not_equal(grouped["activities"], 0), pc.not_equal(grouped["duration_seconds"], 0)))


def _summed(table: pa.Table) -> pa.Table:
    grouped = _grouped_sums(table)
    grouped = grouped.filter(
        pc.or_(pc.not_equal(grouped["activities"], 0), pc.not_equal(grouped["duration_seconds"], 0))
    )
    return grouped.sort_by([(k, "ascending") for k in KEYS])


def _grouped_sums(table: pa.Table) -> pa.Table:
    grouped = table.group_by(list(KEYS)).aggregate([(m, "sum") for m in MEASURES])
    # the aggregates come back named "<column>_sum"; renamed by name, since their position varies by pyarrow version
    grouped = grouped.rename_columns([c[: -len("_sum")] if c.endswith("_sum") else c for c in grouped.column_names])
    return grouped.select(METRICS_SCHEMA.names).cast(METRICS_SCHEMA)
