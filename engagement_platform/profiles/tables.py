"""Delta table specs of the unified-profile CDC lake.

profile_cdc_staging     every tenant's CDC changes, append-only, partitioned by tenant and 15-minute
                        bucket of the CDC timestamp (appends never conflict, so dumpers run freely)
profile_raw/<tenant>    one table per tenant: the current profile rows (one per primary id), fields
                        as a JSON string (schema on read) plus promoted columns for pushdown
profile_progress        per tenant and processor batch: which staging versions were merged
quarantine_profile_cdc  CDC records that never reach staging, in the one quarantine schema
profile_erased_subjects the suppression list (erased identities' ids as keyed hashes), with its
                        audit and the suppressed-record counts (profiles/erasure/)
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from engagement_platform.lake.delta import TableSpec
from engagement_platform.lake.quarantine import kafka_quarantine_spec
from engagement_platform.lake.suppression_tables import erased_subjects_spec, suppressed_records_spec

# Tenants name folders and ZooKeeper lock paths: keep them to a charset that needs no escaping.
TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
BUCKET_SECONDS = 15 * 60
BUCKET_FORMAT = "%Y%m%dT%H%M"  # e.g. 20260105T1015: fixed width, so string order is time order
BUCKET_SPARK_FORMAT = "yyyyMMdd'T'HHmm"

UTC_US = pa.timestamp("us", tz="UTC")

# Promoted from the JSON fields (top-level keys) so queries and MERGEs can prune on them.
PROMOTED = {"email": pa.string(), "country": pa.string(), "updated_at": UTC_US}


def validate_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not re.match(TENANT_PATTERN, tenant):
        raise ValueError(f"tenant {tenant!r} does not match {TENANT_PATTERN}")
    return tenant


def bucket_of(ts: datetime) -> str:
    """The 15-minute staging bucket holding CDC timestamp `ts` (naive = UTC)."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    epoch = int(ts.timestamp())
    floor = datetime.fromtimestamp(epoch - epoch % BUCKET_SECONDS, tz=UTC)
    return floor.strftime(BUCKET_FORMAT)


def bucket_start(bucket: str) -> datetime:
    return datetime.strptime(bucket, BUCKET_FORMAT).replace(tzinfo=UTC)


def bucket_end(bucket: str) -> datetime:
    return bucket_start(bucket) + timedelta(seconds=BUCKET_SECONDS)


_CHANGE_FIELDS = [
    ("primary_id", pa.string()),
    ("related_ids", pa.list_(pa.string())),  # the record's own identity-graph neighbours
    ("record_type", pa.string()),
    ("op", pa.string()),  # upsert | delete
    ("cdc_seq", pa.int64()),
    ("cdc_ts", UTC_US),
    ("fields", pa.string()),  # JSON object text; null on deletes
    *PROMOTED.items(),
]

PROFILE_CDC_STAGING = TableSpec(
    name="profile_cdc_staging",
    schema=pa.schema(
        [
            ("tenant", pa.string()),
            ("bucket", pa.string()),
            *_CHANGE_FIELDS,
            ("source_partition", pa.int32()),
            ("source_offset", pa.int64()),
            ("batch_id", pa.int64()),
            ("staged_at", UTC_US),
        ]
    ),
    partition_by=("tenant", "bucket"),
    # Append-only: the processor finds new rows by snapshot difference, not by change feed.
    change_data_feed=False,
    stats_columns=(
        "primary_id",
        "op",
        "cdc_seq",
        "cdc_ts",
        "email",
        "country",
        "updated_at",
        "batch_id",
        "source_offset",
    ),
    description="Every tenant's profile CDC changes as staged from Kafka: append-only, by tenant and 15-minute bucket.",
)

RAW_SCHEMA = pa.schema(
    [
        ("tenant", pa.string()),
        ("primary_id", pa.string()),
        ("record_type", pa.string()),
        ("linked_ids", pa.list_(pa.string())),  # the latest record's own neighbours (the graph's edges)
        ("related_ids", pa.list_(pa.string())),  # every id of the connected component, sorted, self included
        ("component_id", pa.string()),  # smallest id of the component
        ("cdc_seq", pa.int64()),
        ("cdc_ts", UTC_US),
        ("deleted", pa.bool_()),  # tombstone: kept so an older, late change can never resurrect the row
        ("fields", pa.string()),
        *PROMOTED.items(),
        ("batch_id", pa.int64()),
        ("processed_at", UTC_US),
    ]
)
RAW_STATS_COLUMNS = (
    "primary_id",
    "component_id",
    "record_type",
    "cdc_seq",
    "cdc_ts",
    "deleted",
    "email",
    "country",
    "updated_at",
    "batch_id",
)
RAW_Z_ORDER = ("primary_id", "cdc_ts")


def raw_table_name(tenant: str) -> str:
    return f"profile_raw/{validate_tenant(tenant)}"


def raw_table_spec(tenant: str) -> TableSpec:
    return TableSpec(
        name=raw_table_name(tenant),
        schema=RAW_SCHEMA,
        change_data_feed=False,  # CDF roughly doubles MERGE cost; staging is the change log
        # No statistics on the JSON column: min/max of a big text blob only costs write time.
        stats_columns=RAW_STATS_COLUMNS,
        description=f"Profiles of tenant {tenant}: one row per primary id, fields as JSON, Z-ordered by primary id and timestamp.",
    )


PROFILE_PROGRESS = TableSpec(
    name="profile_progress",
    schema=pa.schema(
        [
            ("tenant", pa.string()),
            ("batch_id", pa.int64()),
            ("staging_version_from", pa.int64()),  # exclusive
            ("staging_version", pa.int64()),  # inclusive: everything staged up to here is merged
            ("last_bucket", pa.string()),
            ("max_cdc_ts", UTC_US),
            ("max_cdc_seq", pa.int64()),
            ("changes_read", pa.int64()),
            ("rows_upserted", pa.int64()),
            ("rows_deleted", pa.int64()),
            ("rows_relinked", pa.int64()),
            ("raw_version", pa.int64()),
            ("processed_at", UTC_US),
        ]
    ),
    change_data_feed=False,
    description="Progress map: per tenant and processor batch, the staging versions and buckets merged into its raw table.",
)

# org_id holds the tenant (when the record had one)
QUARANTINE_PROFILE_CDC = kafka_quarantine_spec(
    "quarantine_profile_cdc",
    "Profile CDC records that never reached staging: raw bytes, topic:partition:offset, reason.",
)

# Erasure (profiles/erasure/): the suppression list (every id of an erased identity, as a keyed hash per
# tenant), the count of records each batch dropped because they named one, and one audit row per request.
PROFILE_ERASED_SUBJECTS = erased_subjects_spec("profile_erased_subjects", "tenant")
PROFILE_SUPPRESSED_RECORDS = suppressed_records_spec("profile_suppressed_records", "tenant")

PROFILE_ERASURE_AUDIT = TableSpec(
    name="profile_erasure_audit",
    schema=pa.schema(
        [
            ("tenant", pa.string()),
            ("request_id", pa.string()),
            ("subject_hash", pa.string()),  # the requested id's keyed hash (lake/suppression.py), never the id
            ("ids_erased", pa.int64()),  # ids of the merged identity erased with it (the documented rule)
            ("request_time", UTC_US),
            ("completed_at", UTC_US),
            ("rows_removed", pa.int64()),
            ("rows_removed_by_table", pa.string()),  # JSON {table: rows}
            ("batch_id", pa.int64()),
            ("source_partition", pa.int32()),
            ("source_offset", pa.int64()),
        ]
    ),
    change_data_feed=False,
    stats_columns=("tenant", "request_id", "batch_id", "completed_at"),
    description="One row per applied profile erasure: the subject's hash, how many linked ids went with it, rows removed per table.",
)

# org_id holds the tenant
QUARANTINE_PROFILE_ERASURE = kafka_quarantine_spec(
    "quarantine_profile_erasure",
    "Profile erasure requests that are malformed or repeated: raw request, position, reason.",
)
