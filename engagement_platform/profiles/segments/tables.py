"""Delta table specs of segment membership: who is in which segment now, and who entered or left when."""

from __future__ import annotations

import pyarrow as pa

from engagement_platform.lake.delta import TableSpec

_TS = pa.timestamp("us", tz="UTC")

PROFILE_SEGMENTS = TableSpec(
    name="profile_segments",
    schema=pa.schema(
        [
            ("tenant", pa.string()),
            ("segment", pa.string()),
            ("identity", pa.string()),  # identity: the component id
            ("entered_at", _TS),
            ("batch_id", pa.int64()),
        ]
    ),
    partition_by=("tenant",),
    change_data_feed=False,
    stats_columns=("segment", "identity", "entered_at", "batch_id"),
    description="Segment membership: one row per tenant, segment and merged identity in it, with when it entered.",
)

PROFILE_SEGMENT_CHANGES = TableSpec(
    name="profile_segment_changes",
    schema=pa.schema(
        [
            ("tenant", pa.string()),
            ("segment", pa.string()),
            ("identity", pa.string()),
            ("change", pa.string()),  # entered | exited
            ("evaluated_at", _TS),
            ("raw_version", pa.int64()),
            ("batch_id", pa.int64()),
        ]
    ),
    partition_by=("tenant",),
    change_data_feed=False,
    stats_columns=("segment", "change", "evaluated_at", "batch_id"),
    description="Segment entries and exits per evaluation: what downstream activation reads since its checkpoint.",
)
