"""Delta table specs of the ID mutation stream: the request log, the pending requests
(targets not ingested yet) and the quarantine of malformed or expired requests."""

from __future__ import annotations

import pyarrow as pa

from engagement_platform.lake.delta import TableSpec
from engagement_platform.lake.quarantine import kafka_quarantine_spec

ENGAGEMENT_MUTATION_REQUESTS = TableSpec(
    name="engagement_mutation_requests",
    schema=pa.schema(
        [
            ("org_id", pa.string()),
            ("request_date", pa.date32()),  # request_time's UTC day (partition)
            ("request_id", pa.string()),
            ("request_time", pa.timestamp("us", tz="UTC")),
            ("op", pa.string()),
            ("from_field", pa.string()),
            ("from_id", pa.string()),
            ("to_field", pa.string()),
            ("to_id", pa.string()),
            ("field", pa.string()),
            ("from_ids", pa.list_(pa.string())),
            ("id", pa.string()),
            ("engagement_id", pa.string()),
            ("record", pa.string()),  # update: the record as JSON
            ("date_from", pa.date32()),
            ("date_to", pa.date32()),
            ("request_json", pa.string()),  # the whole request, canonical JSON
            ("outcome", pa.string()),  # on arrival: applied | pending | expired
            ("batch_id", pa.int64()),
            ("source_partition", pa.int32()),
            ("source_offset", pa.int64()),
            ("received_at", pa.timestamp("us", tz="UTC")),
        ]
    ),
    partition_by=("org_id", "request_date"),
    change_data_feed=False,
    stats_columns=("request_id", "request_time", "op", "batch_id", "engagement_id", "from_id", "to_id", "id"),
    description="Raw log of every valid ID mutation request, with its Kafka position and batch.",
)

ENGAGEMENT_MUTATIONS_PENDING = TableSpec(
    name="engagement_mutations_pending",
    schema=pa.schema(
        [
            ("org_id", pa.string()),
            ("request_id", pa.string()),
            ("request_time", pa.timestamp("us", tz="UTC")),
            ("request_json", pa.string()),
            ("missing_targets", pa.string()),  # JSON list of {kind, field, id}
            ("first_seen_batch", pa.int64()),
            ("last_batch", pa.int64()),  # the batch that last tried it
            ("attempts", pa.int64()),
            ("expires_batch", pa.int64()),  # quarantined if still unresolved in this batch
            ("source_partition", pa.int32()),
            ("source_offset", pa.int64()),
            (
                "first_seen_at",
                pa.timestamp("us", tz="UTC"),
            ),  # as-of time of the batch that first held it back (age horizon)
        ]
    ),
    partition_by=("org_id",),
    change_data_feed=False,
    description="Mutation requests whose targets are not in engagement_activity yet; retried every batch.",
)

QUARANTINE_ENGAGEMENT_MUTATIONS = kafka_quarantine_spec(
    "quarantine_engagement_mutations",
    "Mutation requests that are malformed or whose targets never arrived: raw request, position, reason.",
)
