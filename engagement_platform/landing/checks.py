"""Checks of an ingest pipeline's batch, measured from the committed tables: records conserved and the
error rate under the pipeline's threshold. Each emits the numbers it measured.

They run after the batch's tables are committed (audits of a committed batch), so none is declared
blocking; a pipeline whose policy is `block` reports its error rate as an ERROR instead of a warning.
"""

from __future__ import annotations

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey

from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.lake.audit import quarantined_records, rows_of_batch
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.suppression_tables import suppressed_in_batch, suppression_of
from engagement_platform.landing.apply import LandingResult, stream_name
from engagement_platform.orchestration.checks import RECORDS_CONSERVED, conservation

ERROR_RATE = "error_rate_under_threshold"


def pipeline_check_specs(config: PipelineConfig, asset: AssetKey) -> list[AssetCheckSpec]:
    policy = config.error_rate
    return [
        AssetCheckSpec(
            RECORDS_CONSERVED,
            asset=asset,
            description="Records read = rows in the target table + distinct records in the quarantine table + records suppressed (erased subjects), for this batch.",
        ),
        AssetCheckSpec(
            ERROR_RATE,
            asset=asset,
            description=f"Rejected records / records read <= {policy.max_error_rate}, for the batch and for each of its files "
            f"({policy.severity} when above).",
        ),
    ]


def evaluate_pipeline_checks(lake: DeltaLake, config: PipelineConfig, result: LandingResult) -> list[AssetCheckResult]:
    batch_id = result.plan.batch_id
    written = rows_of_batch(lake, config.target.table, batch_id)
    quarantined = quarantined_records(lake, config.target.quarantine_table, batch_id, pipeline=config.name)
    tables = suppression_of(lake, config.suppression.list_table) if config.suppression else None
    suppressed = suppressed_in_batch(lake, tables[1], stream_name(config), batch_id) if tables else 0
    policy = config.error_rate
    rate = quarantined / result.records_read if result.records_read else 0.0
    # Per file too: one bad export among many good ones in a batch must not pass under the batch's average.
    worst = max(result.files, key=lambda f: f.error_rate, default=None)
    worst_rate = worst.error_rate if worst else 0.0
    return [
        conservation(
            RECORDS_CONSERVED,
            ("records_read", result.records_read),
            {"rows_in_table": written, "records_quarantined": quarantined, "records_suppressed": suppressed},
        ),
        AssetCheckResult(
            check_name=ERROR_RATE,
            passed=rate <= policy.max_error_rate and worst_rate <= policy.max_error_rate,
            severity=AssetCheckSeverity.ERROR if policy.severity == "block" else AssetCheckSeverity.WARN,
            metadata={
                "error_rate": round(rate, 6),
                "max_error_rate": policy.max_error_rate,
                "records_rejected": quarantined,
                "files": len(result.files),
                "worst_file": worst.path if worst else "-",
                "worst_file_error_rate": round(worst_rate, 6),
                "records_read": result.records_read,
                **{f"errors_{k}": v for k, v in sorted(result.errors_by_code.items())},
            },
        ),
    ]
