"""Delta table specs of the TTL / GDPR retention stream: the audit of every request and the
quarantine of malformed ones."""

from __future__ import annotations

import pyarrow as pa

from engagement_platform.lake.delta import TableSpec
from engagement_platform.lake.quarantine import kafka_quarantine_spec

GDPR_AUDIT = TableSpec(
    name="gdpr_audit",
    schema=pa.schema(
        [
            ("org_id", pa.string()),
            ("request_id", pa.string()),
            ("kind", pa.string()),  # retention | erasure
            ("subject_hash", pa.string()),  # erasure: the subject's keyed hash (lake/suppression.py), never the id
            ("retention_days", pa.int32()),  # retention: rows older than this many days went
            ("cutoff_date", pa.date32()),  # retention: engagement_date < cutoff_date went (request day - days)
            ("request_time", pa.timestamp("us", tz="UTC")),
            ("received_at", pa.timestamp("us", tz="UTC")),  # the batch's pinned as-of time
            ("completed_at", pa.timestamp("us", tz="UTC")),  # every table of the batch committed
            ("rows_removed", pa.int64()),  # total over the tables
            ("rows_removed_by_table", pa.string()),  # JSON {table: rows}
            ("request_json", pa.string()),  # the request, an erasure's subject_id replaced by its subject_hash
            ("batch_id", pa.int64()),
            ("source_partition", pa.int32()),
            ("source_offset", pa.int64()),
        ]
    ),
    partition_by=("org_id",),
    change_data_feed=False,
    stats_columns=("request_id", "kind", "batch_id", "completed_at"),
    description=(
        "One row per applied retention or erasure request: when it completed and how many rows went per table. "
        "An erasure's subject is kept only as its keyed hash (subject_hash, also in request_json), never the id."
    ),
)

QUARANTINE_ENGAGEMENT_GDPR = kafka_quarantine_spec(
    "quarantine_engagement_gdpr",
    "Retention / erasure requests that are malformed or repeated: raw request, position, reason.",
)
