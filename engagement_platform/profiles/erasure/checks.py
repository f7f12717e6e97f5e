"""Checks of a profile erasure batch, measured from the committed tables: no erased id (by hash) left in
any raw table, staging or the CDC quarantine; requests accounted for (plus offset
contiguity, which every Kafka stream has)."""

from __future__ import annotations

from dagster import AssetCheckResult

from engagement_platform.lake.audit import quarantined_records, rows_of_batch
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.suppression_tables import load_suppressed, suppressed_in_batch, suppressed_records_total
from engagement_platform.orchestration.checks import REQUESTS_ACCOUNTED, BatchChecks, conservation
from engagement_platform.profiles.erasure.apply import STREAM
from engagement_platform.profiles.erasure.audit import ProfileErasureResult
from engagement_platform.profiles.erasure.remaining import profile_rows_naming
from engagement_platform.profiles.tables import (
    PROFILE_ERASED_SUBJECTS,
    PROFILE_ERASURE_AUDIT,
    PROFILE_SUPPRESSED_RECORDS,
    QUARANTINE_PROFILE_ERASURE,
)
from engagement_platform.settings import load_settings

IDENTITY_ERASED_EVERYWHERE = "identity_erased_everywhere"


def evaluate(lake: DeltaLake, checkpoints: CheckpointStore, result: ProfileErasureResult) -> list[AssetCheckResult]:
    batch_id = result.plan.batch_id
    suppressed = load_suppressed(lake, PROFILE_ERASED_SUBJECTS, load_settings().erasure.secret)
    remaining = profile_rows_naming(lake, suppressed)  # every tenant with an erased identity, not only this batch's
    return [
        AssetCheckResult(
            check_name=IDENTITY_ERASED_EVERYWHERE,
            passed=sum(remaining.values()) == 0,
            metadata={
                "ids_suppressed": len(suppressed.pairs()),
                "ids_erased_in_batch": result.ids_erased,
                "records_suppressed_since": suppressed_records_total(lake, PROFILE_SUPPRESSED_RECORDS),
                "rows_remaining": sum(remaining.values()),
                **{f"rows_remaining_{t.replace('/', '_')}": n for t, n in remaining.items()},
            },
        ),
        conservation(
            REQUESTS_ACCOUNTED,
            ("requests_read", result.requests_read),
            {
                "requests_applied": rows_of_batch(lake, PROFILE_ERASURE_AUDIT.name, batch_id),
                "requests_quarantined": quarantined_records(lake, QUARANTINE_PROFILE_ERASURE.name, batch_id),
                "requests_suppressed": suppressed_in_batch(lake, PROFILE_SUPPRESSED_RECORDS, STREAM, batch_id),
            },
            planned=result.plan.record_count,
            unread_warns=False,
        ),
    ]


PROFILE_ERASURE_CHECKS = [
    BatchChecks(
        {
            IDENTITY_ERASED_EVERYWHERE: "No id of any erased identity (the suppression list, by hash) is in a raw table, staging or the CDC quarantine.",
            REQUESTS_ACCOUNTED: "Requests read = applied (audit rows) + quarantined + suppressed (naming an erased id); none unaccounted.",
        },
        evaluate,
    ),
]
