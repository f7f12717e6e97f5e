"""Checks of an ingestion batch, measured from the committed tables: no duplicate engagement ids in the
orgs it touched, records conserved, notifications match the data commit (plus offset contiguity, which
every Kafka stream has)."""

from __future__ import annotations

from dagster import AssetCheckResult

from engagement_platform.engagement import integrity
from engagement_platform.engagement.ingestion.apply import APP_ID, STREAM, IngestResult
from engagement_platform.engagement.tables import (
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_NOTIFICATIONS,
    ENGAGEMENT_SUPPRESSED_RECORDS,
    QUARANTINE_ENGAGEMENT_INGESTION,
)
from engagement_platform.lake.audit import quarantined_records
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.suppression_tables import suppressed_in_batch
from engagement_platform.orchestration.checks import (
    RECORDS_CONSERVED,
    BatchChecks,
    conservation,
    notifications_match_changes,
)

NO_DUPLICATE_ENGAGEMENT_IDS = "no_duplicate_engagement_ids"
NO_DUPLICATES_DESCRIPTION = (
    "No (org_id, engagement_id) appears twice in engagement_activity, in the orgs this batch touched."
)


def no_duplicate_engagement_ids(duplicates: int, orgs_checked: int) -> AssetCheckResult:
    return AssetCheckResult(
        check_name=NO_DUPLICATE_ENGAGEMENT_IDS,
        passed=duplicates == 0,
        metadata={"duplicate_rows": duplicates, "orgs_checked": orgs_checked},
    )


def evaluate(lake: DeltaLake, checkpoints: CheckpointStore, result: IngestResult) -> list[AssetCheckResult]:
    plan = result.plan
    # One read of the touched orgs' keys gives both the duplicates and the rows this batch appended.
    duplicates, appended = integrity.key_audit(lake, result.org_ids, plan.batch_id) if result.org_ids else (0, 0)
    quarantined = quarantined_records(lake, QUARANTINE_ENGAGEMENT_INGESTION.name, plan.batch_id, pipeline=STREAM)
    return [
        no_duplicate_engagement_ids(duplicates, len(result.org_ids)),
        conservation(
            RECORDS_CONSERVED,
            ("records_read", result.records_read),
            {
                "rows_in_table": appended,
                "records_quarantined": quarantined,
                "records_suppressed": suppressed_in_batch(lake, ENGAGEMENT_SUPPRESSED_RECORDS, STREAM, plan.batch_id),
            },
            planned=plan.record_count,
        ),
    ]


INGESTION_CHECKS = [
    BatchChecks(
        {
            NO_DUPLICATE_ENGAGEMENT_IDS: NO_DUPLICATES_DESCRIPTION,
            RECORDS_CONSERVED: "Records read = rows appended + records quarantined + records suppressed (erased subjects), and every planned offset was read.",
        },
        evaluate,
    ),
    notifications_match_changes(ENGAGEMENT_NOTIFICATIONS.name, ENGAGEMENT_ACTIVITY.name, APP_ID, "data commit"),
]
