"""Checks of a mutation batch: no duplicate engagement ids in the orgs it touched, requests accounted for,
notifications match the data commit (plus offset contiguity, which every Kafka stream has)."""

from __future__ import annotations

from dagster import AssetCheckResult

from engagement_platform.engagement import integrity
from engagement_platform.engagement.ingestion.checks import (
    NO_DUPLICATE_ENGAGEMENT_IDS,
    NO_DUPLICATES_DESCRIPTION,
    no_duplicate_engagement_ids,
)
from engagement_platform.engagement.mutation.apply import APP_ID, MutationResult
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_NOTIFICATIONS
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.orchestration.checks import (
    REQUESTS_ACCOUNTED,
    BatchChecks,
    conservation,
    notifications_match_changes,
)


def evaluate(lake: DeltaLake, checkpoints: CheckpointStore, result: MutationResult) -> list[AssetCheckResult]:
    duplicates, _ = integrity.key_audit(lake, result.org_ids, None) if result.org_ids else (0, 0)
    return [
        no_duplicate_engagement_ids(duplicates, len(result.org_ids)),
        conservation(
            REQUESTS_ACCOUNTED,
            ("requests_read", result.requests_read),
            {
                "requests_valid": result.requests_valid,
                "requests_malformed": result.requests_malformed,
                "requests_suppressed": result.requests_suppressed,
            },
            extra={
                "requests_applied": result.requests_applied,
                "pending_now": result.pending_added + result.pending_retained,
                "pending_expired": result.pending_expired,
            },
        ),
    ]


MUTATION_CHECKS = [
    BatchChecks(
        {
            NO_DUPLICATE_ENGAGEMENT_IDS: NO_DUPLICATES_DESCRIPTION,
            REQUESTS_ACCOUNTED: "Requests read = valid + malformed (quarantined) + suppressed (naming an erased subject); none unaccounted.",
        },
        evaluate,
    ),
    notifications_match_changes(ENGAGEMENT_NOTIFICATIONS.name, ENGAGEMENT_ACTIVITY.name, APP_ID, "data commit"),
]
