"""The one error schema every pipeline's quarantine table uses (one row per error of a record), and the
table spec of a Kafka stream's quarantine."""

from __future__ import annotations

import pyarrow as pa

from engagement_platform.lake.delta import TableSpec

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


def kafka_quarantine_spec(name: str, description: str) -> TableSpec:
    """A Kafka stream's quarantine table: partitioned by pipeline and day, statistics on the source position."""
    return TableSpec(
        name=name,
        schema=QUARANTINE_SCHEMA,
        partition_by=("pipeline", "quarantine_date"),
        stats_columns=("source_partition", "source_offset", "batch_id", "error_code"),
        description=description,
    )
