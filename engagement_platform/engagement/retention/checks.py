"""Checks of a retention batch, measured from the committed tables (gdpr_audit, the quarantine, every
erased table), not from the run's own counts: subjects erased everywhere, requests accounted for,
notifications match the delete commit (plus offset contiguity, which every Kafka stream has)."""

from __future__ import annotations

from dagster import AssetCheckResult

from engagement_platform.engagement.retention.apply import APP_ID, STREAM, RetentionResult, audited_erasures
from engagement_platform.engagement.retention.erasure import rows_naming
from engagement_platform.engagement.retention.tables import GDPR_AUDIT, QUARANTINE_ENGAGEMENT_GDPR
from engagement_platform.engagement.tables import (
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_ERASED_SUBJECTS,
    ENGAGEMENT_NOTIFICATIONS,
    ENGAGEMENT_SUPPRESSED_RECORDS,
)
from engagement_platform.lake.audit import quarantined_records, rows_of_batch
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.suppression_tables import load_suppressed, suppressed_in_batch, suppressed_records_total
from engagement_platform.orchestration.checks import (
    REQUESTS_ACCOUNTED,
    BatchChecks,
    conservation,
    notifications_match_changes,
)
from engagement_platform.settings import load_settings

SUBJECT_ERASED_EVERYWHERE = "subject_erased_everywhere"


def evaluate(lake: DeltaLake, checkpoints: CheckpointStore, result: RetentionResult) -> list[AssetCheckResult]:
    batch_id = result.plan.batch_id
    # every subject ever erased, by hash: the lake keeps no id to look for, and none may have come back
    suppressed = load_suppressed(lake, ENGAGEMENT_ERASED_SUBJECTS, load_settings().erasure.secret)
    remaining = rows_naming(lake, suppressed)
    applied = rows_of_batch(lake, GDPR_AUDIT.name, batch_id)
    quarantined = quarantined_records(lake, QUARANTINE_ENGAGEMENT_GDPR.name, batch_id)
    return [
        AssetCheckResult(
            check_name=SUBJECT_ERASED_EVERYWHERE,
            passed=sum(remaining.values()) == 0,
            metadata={
                "subjects_suppressed": len(suppressed.pairs()),
                "erasures_in_batch": len(audited_erasures(lake, batch_id)),
                "records_suppressed_since": suppressed_records_total(lake, ENGAGEMENT_SUPPRESSED_RECORDS),
                "rows_remaining": sum(remaining.values()),
                **{f"rows_remaining_{t}": n for t, n in remaining.items()},
            },
        ),
        conservation(
            REQUESTS_ACCOUNTED,
            ("requests_read", result.requests_read),
            {
                "requests_applied": applied,
                "requests_quarantined": quarantined,
                "requests_suppressed": suppressed_in_batch(lake, ENGAGEMENT_SUPPRESSED_RECORDS, STREAM, batch_id),
            },
            planned=result.plan.record_count,
            unread_warns=False,
        ),
    ]


RETENTION_CHECKS = [
    BatchChecks(
        {
            SUBJECT_ERASED_EVERYWHERE: "No row of any erased subject (the suppression list, by hash) is in any table: erased rows went, none came back.",
            REQUESTS_ACCOUNTED: "Requests read = applied (gdpr_audit rows) + quarantined (quarantine_engagement_gdpr records); none dropped.",
        },
        evaluate,
    ),
    notifications_match_changes(ENGAGEMENT_NOTIFICATIONS.name, ENGAGEMENT_ACTIVITY.name, APP_ID, "delete commit"),
]
