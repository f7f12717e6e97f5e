"""Delta table specs of the engagement activity lake (schemas, partitions, properties)."""

from __future__ import annotations

import pyarrow as pa

from engagement_platform.lake.change_log import change_log_spec
from engagement_platform.lake.delta import TableSpec
from engagement_platform.lake.quarantine import kafka_quarantine_spec
from engagement_platform.lake.suppression_tables import erased_subjects_spec, suppressed_records_spec

ACTIVITY_TYPES = (
    "email_sent",
    "email_opened",
    "email_clicked",
    "email_replied",
    "email_bounced",
    "call",
    "meeting",
    "video_viewed",
    "linkedin_message",
    "task_completed",
)
# The coordinator lock every writer of engagement_activity (ingestion, mutation, retention) takes: their
# batches read a pinned version and commit one at a time.
ACTIVITY_LOCK = "engagement_activity"
CALL_OUTCOMES = ("connected", "meaningful_contact", "left_voicemail", "no_answer", "not_interested", "wrong_number")

ENGAGEMENT_ACTIVITY = TableSpec(
    name="engagement_activity",
    schema=pa.schema(
        [
            ("org_id", pa.string()),
            ("engagement_id", pa.string()),
            ("engagement_date", pa.date32()),
            ("activity_type", pa.string()),
            ("lead_id", pa.string()),
            ("contact_id", pa.string()),
            ("account_id", pa.string()),
            ("user_id", pa.string()),
            ("cadence_id", pa.string()),
            ("template_id", pa.string()),
            ("subject", pa.string()),
            ("call_outcome", pa.string()),
            ("duration_seconds", pa.int32()),
            ("payload", pa.string()),
            ("event_time", pa.timestamp("us", tz="UTC")),
            ("ingestion_time", pa.timestamp("us", tz="UTC")),
            ("source_partition", pa.int32()),
            ("source_offset", pa.int64()),
            ("batch_id", pa.int64()),
        ]
    ),
    partition_by=("org_id",),
    # Stats where queries and mutations filter (dates, ids); never on the free-text payload.
    stats_columns=(
        "engagement_date",
        "engagement_id",
        "lead_id",
        "contact_id",
        "account_id",
        "event_time",
        "activity_type",
        "batch_id",
    ),
    description="One row per engagement activity (email, call, meeting, video...), partitioned by org.",
)

# Row-level changes of the engagement_activity commits that carry no change-data files (the mutation
# stream's file rewrites): what incremental readers and notification counts use for those versions.
ENGAGEMENT_ACTIVITY_CHANGES = change_log_spec(ENGAGEMENT_ACTIVITY)

ENGAGEMENT_NOTIFICATIONS = TableSpec(
    name="engagement_notifications",
    schema=pa.schema(
        [
            ("org_id", pa.string()),
            ("ingestion_hour", pa.string()),
            ("table_name", pa.string()),
            ("table_version", pa.int64()),
            ("last_modified_time", pa.timestamp("us", tz="UTC")),
            ("inserted", pa.int64()),
            ("updated", pa.int64()),
            ("deleted", pa.int64()),
            ("app_name", pa.string()),
            ("batch_id", pa.int64()),
        ]
    ),
    partition_by=("org_id", "ingestion_hour"),
    description="One row per org per batch per table: what changed, for incremental readers.",
)

QUARANTINE_ENGAGEMENT_INGESTION = kafka_quarantine_spec(
    "quarantine_engagement_ingestion",
    "Engagement records that could not be ingested: raw bytes, source position, reason.",
)

# The engagement lake's suppression list (erased subjects as keyed hashes, per org) and the count of records
# each batch dropped because they named one (lake/suppression_tables.py).
ENGAGEMENT_ERASED_SUBJECTS = erased_subjects_spec("engagement_erased_subjects", "org_id")
ENGAGEMENT_SUPPRESSED_RECORDS = suppressed_records_spec("engagement_suppressed_records", "org_id")
