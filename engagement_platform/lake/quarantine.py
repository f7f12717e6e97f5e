"""The one error schema every pipeline's quarantine table uses (one row per error of a record)."""

from __future__ import annotations

import pyarrow as pa

QUARANTINE_SCHEMA = pa.schema(
    [
        ("pipeline", pa.string()),
        ("batch_id", pa.int64()),
        ("row_id", pa.string()),  # topic:partition:offset, or file:line
        ("source", pa.string()),
        ("source_partition", pa.int32()),
        ("source_offset", pa.int64()),
        ("org_id", pa.string()),
        ("raw", pa.binary()),
        ("input", pa.string()),  # the record's parsed input columns as JSON (null if it did not parse)
        ("stage", pa.string()),  # parse | convert | validate
        ("plugin", pa.string()),
        ("column_name", pa.string()),
        ("error_code", pa.string()),
        ("message", pa.string()),
        ("value", pa.string()),
        ("quarantined_at", pa.timestamp("us", tz="UTC")),
        ("quarantine_date", pa.date32()),
    ]
)
