"""A small partitioned table and its rows, for tests of files written outside delta-rs."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa

from engagement_platform.lake.delta import TableSpec

SPEC = TableSpec(
    name="events",
    schema=pa.schema(
        [
            ("org_id", pa.string()),
            ("event_id", pa.string()),
            ("day", pa.date32()),
            ("at", pa.timestamp("us", tz="UTC")),
            ("n", pa.int64()),
            ("note", pa.string()),
        ]
    ),
    partition_by=("org_id",),
    stats_columns=("event_id", "day", "at", "n"),
)
T0 = datetime(2026, 1, 5, 10, 0, 0, 123456, tzinfo=UTC)


def rows(orgs: list[str | None], start: int = 0, day: date = date(2026, 1, 5)) -> pa.Table:
    n = len(orgs)
    return pa.table(
        {
            "org_id": orgs,
            "event_id": [f"e{start + i:05d}" for i in range(n)],
            "day": [day] * n,
            "at": [T0 + timedelta(seconds=start + i) for i in range(n)],
            "n": list(range(start, start + n)),
            "note": ["x"] * n,
        },
        schema=SPEC.schema,
    )
