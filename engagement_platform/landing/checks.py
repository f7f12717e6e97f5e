"""Asset checks of an ingest pipeline's batch. Each emits the numbers it measured."""

from __future__ import annotations

import pyarrow.compute as pc
from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey

from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.landing.apply import LandingResult
from engagement_platform.lake.delta import DeltaLake

RECORDS_CONSERVED = "records_conserved"
ERROR_RATE = "error_rate_under_threshold"


def pipeline_check_specs(config: PipelineConfig, asset: AssetKey) -> list[AssetCheckSpec]:
    policy = config.error_rate
    return [
        AssetCheckSpec(RECORDS_CONSERVED, asset=asset, blocking=True,
                       description="Records read = rows in the target table + distinct records in the quarantine table, for this batch."),
        AssetCheckSpec(ERROR_RATE, asset=asset, blocking=policy.severity == "block",
                       description=f"Rejected records / records read <= {policy.max_error_rate} ({policy.severity} when above)."),
    ]


def batch_counts(lake: DeltaLake, config: PipelineConfig, batch_id: int) -> tuple[int, int]:
    """(rows of the batch in the target table, distinct records of the batch in the quarantine table),
    read back from the tables rather than taken from the run's own counts."""
    target = config.target
    written = lake.read(target.table, filters=[("batch_id", "=", batch_id)], columns=["batch_id"]).num_rows if lake.exists(target.table) else 0
    if not lake.exists(target.quarantine_table):
        return written, 0
    rows = lake.read(target.quarantine_table, filters=[("pipeline", "=", config.name), ("batch_id", "=", batch_id)], columns=["row_id"])
    return written, len(pc.unique(rows["row_id"]))


def evaluate_pipeline_checks(lake: DeltaLake, config: PipelineConfig, result: LandingResult) -> list[AssetCheckResult]:
    written, quarantined = batch_counts(lake, config, result.plan.batch_id)
    unaccounted = result.records_read - written - quarantined
    policy = config.error_rate
    rate = quarantined / result.records_read if result.records_read else 0.0
    return [
        AssetCheckResult(check_name=RECORDS_CONSERVED, passed=unaccounted == 0,
                         metadata={"records_read": result.records_read, "rows_in_table": written, "records_quarantined": quarantined, "unaccounted": unaccounted}),
        AssetCheckResult(check_name=ERROR_RATE, passed=rate <= policy.max_error_rate,
                         severity=AssetCheckSeverity.ERROR if policy.severity == "block" else AssetCheckSeverity.WARN,
                         metadata={"error_rate": round(rate, 6), "max_error_rate": policy.max_error_rate, "records_rejected": quarantined,
                                   "records_read": result.records_read, **{f"errors_{k}": v for k, v in sorted(result.errors_by_code.items())}}),
    ]
