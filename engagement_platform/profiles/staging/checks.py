"""Checks of a CDC dumper batch, measured from the committed tables (the batch's rows), not from the
run's own counts: records accounted for (plus offset contiguity, which every Kafka stream has)."""

from __future__ import annotations

from dagster import AssetCheckResult

from engagement_platform.lake.audit import quarantined_records, rows_of_batch
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.suppression_tables import suppressed_in_batch
from engagement_platform.orchestration.checks import BatchChecks, conservation
from engagement_platform.profiles.staging.apply import STREAM, StageResult
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, PROFILE_SUPPRESSED_RECORDS, QUARANTINE_PROFILE_CDC

RECORDS_ACCOUNTED = "records_accounted"


def evaluate(lake: DeltaLake, checkpoints: CheckpointStore, result: StageResult) -> list[AssetCheckResult]:
    batch_id = result.plan.batch_id
    staged = rows_of_batch(lake, PROFILE_CDC_STAGING.name, batch_id)
    quarantined = quarantined_records(lake, QUARANTINE_PROFILE_CDC.name, batch_id, pipeline=STREAM)
    suppressed = suppressed_in_batch(lake, PROFILE_SUPPRESSED_RECORDS, STREAM, batch_id)
    return [
        conservation(
            RECORDS_ACCOUNTED,
            ("records_read", result.records_read),
            {"rows_staged": staged, "records_quarantined": quarantined, "records_suppressed": suppressed},
            planned=result.plan.record_count,
        )
    ]


STAGING_CHECKS = [
    BatchChecks(
        {
            RECORDS_ACCOUNTED: "Records read = rows staged + records quarantined + records suppressed (erased identities) for the batch, and every planned offset was read."
        },
        evaluate,
    ),
]
