"""Incremental computation: what changed for a tenant between two times, read from the staging table.

The staging table is the change log: partition pruning on the tenant and the 15-minute buckets that
can hold [start, end), then file skipping on cdc_ts. Times are CDC timestamps (when the hot store
changed), so a consumer asking for [t1, t2) later still sees changes that were staged late.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.delta import DeltaLake
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, bucket_of, validate_tenant


def _utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def tenant_changes(lake: DeltaLake, tenant: str, start: datetime, end: datetime, latest_only: bool = False) -> pa.Table:
    """Staged changes of `tenant` with start <= cdc_ts < end, ordered by CDC sequence.

    latest_only: one row per primary id, its newest change in the window (what a consumer re-derives)."""
    validate_tenant(tenant)
    start, end = _utc(start), _utc(end)
    if end <= start or not lake.exists(PROFILE_CDC_STAGING.name):
        return PROFILE_CDC_STAGING.schema.empty_table()
    last_bucket = bucket_of(end - timedelta(microseconds=1))
    rows = lake.read(
        PROFILE_CDC_STAGING.name,
        filters=[
            ("tenant", "=", tenant),
            ("bucket", ">=", bucket_of(start)),
            ("bucket", "<=", last_bucket),
            ("cdc_ts", ">=", start),
            ("cdc_ts", "<", end),
        ],
    )
    rows = rows.sort_by([("cdc_seq", "ascending"), ("source_partition", "ascending"), ("source_offset", "ascending")])
    if latest_only and rows.num_rows:
        index = pa.array(range(rows.num_rows), pa.int64())
        last = (
            pa.table({"primary_id": rows["primary_id"], "i": index})
            .group_by("primary_id", use_threads=False)
            .aggregate([("i", "max")])
        )
        newest = last["i_max"]
        rows = rows.take(pc.take(newest, pc.sort_indices(newest)))  # keep the sequence order
    return rows
