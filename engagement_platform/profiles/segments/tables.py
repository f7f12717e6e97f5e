"""Delta table specs of segment membership, kept merge-on-read: a compacted base and an append-only log of
entries and exits (current.py says how the two make the current membership)."""

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
            ("batch_id", pa.int64()),  # the evaluation batch the pair entered in
        ]
    ),
    partition_by=("tenant",),
    change_data_feed=False,
    stats_columns=("segment", "identity", "entered_at", "batch_id"),
    description="Segment membership, compacted base: one row per tenant, segment and identity that was a member "
    "at the batch the tenant's base is compacted through (txn `profile.segments.compaction/<tenant>`); rewritten "
    "only by a compaction (and erasure), sorted by identity then segment, each file's members per segment in its "
    "footer; merged on read with profile_segment_changes.",
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
    description="Segment membership, change log: every evaluation's entries and exits, appended a file per tenant "
    "and batch; merged on read with the profile_segments base, and what activation reads since its checkpoint.",
)
