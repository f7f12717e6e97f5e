"""Asset checks of the profile CDC lake. Each emits the numbers it measured, so the UI plots them."""

from __future__ import annotations

import pyarrow.compute as pc
from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey

from engagement_platform.lake.delta import DeltaLake
from engagement_platform.profiles.lag import TenantLag, max_lag_seconds
from engagement_platform.profiles.staging.apply import STREAM, StageResult
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, QUARANTINE_PROFILE_CDC, raw_table_name

RECORDS_ACCOUNTED = "records_accounted"
REPLICATION_LAG_UNDER_THRESHOLD = "replication_lag_under_threshold"
NO_DUPLICATE_PRIMARY_IDS = "no_duplicate_primary_ids"


def staging_check_specs(asset: AssetKey) -> list[AssetCheckSpec]:
    return [AssetCheckSpec(RECORDS_ACCOUNTED, asset=asset, blocking=True,
                           description="Records read = rows staged + records quarantined for the batch, and every planned offset was read.")]


def raw_check_specs(asset: AssetKey) -> list[AssetCheckSpec]:
    return [
        AssetCheckSpec(REPLICATION_LAG_UNDER_THRESHOLD, asset=asset,
                       description="Newest staged CDC time minus newest merged CDC time of the tenant is under "
                                   "EP_PROFILE_MAX_LAG_SECONDS (also evaluated every minute by profile_lag_sensor)."),
        AssetCheckSpec(NO_DUPLICATE_PRIMARY_IDS, asset=asset, blocking=True,
                       description="No primary id appears twice in the tenant's raw table."),
    ]


def evaluate_staging_checks(lake: DeltaLake, result: StageResult) -> list[AssetCheckResult]:
    """Measured from the committed tables (the batch's rows), not from the run's own counts."""
    batch = result.plan.batch_id
    staged = lake.read(PROFILE_CDC_STAGING.name, filters=[("batch_id", "=", batch)], columns=["batch_id"]).num_rows
    quarantined = 0
    if lake.exists(QUARANTINE_PROFILE_CDC.name):
        rows = lake.read(QUARANTINE_PROFILE_CDC.name, filters=[("pipeline", "=", STREAM), ("batch_id", "=", batch)], columns=["row_id"])
        quarantined = pc.count_distinct(rows["row_id"]).as_py() if rows.num_rows else 0
    unaccounted = result.records_read - staged - quarantined
    unread = result.plan.record_count - result.records_read
    return [AssetCheckResult(
        check_name=RECORDS_ACCOUNTED, passed=unaccounted == 0 and unread == 0,
        # Offsets may legitimately be missing on compacted or transactional topics: warn, don't block.
        severity=AssetCheckSeverity.ERROR if unaccounted else AssetCheckSeverity.WARN,
        metadata={"records_read": result.records_read, "rows_staged": staged, "records_quarantined": quarantined,
                  "unaccounted": unaccounted, "planned_but_unread": unread},
    )]


def lag_check(lag: TenantLag, threshold: float | None = None) -> dict:
    """The lag check's outcome as AssetCheckResult / AssetCheckEvaluation keyword arguments."""
    threshold = max_lag_seconds() if threshold is None else threshold
    return {"check_name": REPLICATION_LAG_UNDER_THRESHOLD, "passed": lag.replication_lag_seconds <= threshold,
            "metadata": {"tenant": lag.tenant, "max_lag_seconds": threshold, **lag.metadata()}}


def duplicate_primary_ids(lake: DeltaLake, tenant: str) -> tuple[int, int]:
    """(rows beyond one per primary id, rows) in the tenant's raw table."""
    name = raw_table_name(tenant)
    if not lake.exists(name):
        return 0, 0
    ids = lake.read(name, columns=["primary_id"])["primary_id"]
    return len(ids) - pc.count_distinct(ids).as_py(), len(ids)


def evaluate_raw_checks(lake: DeltaLake, tenant: str, lag: TenantLag) -> list[AssetCheckResult]:
    duplicates, rows = duplicate_primary_ids(lake, tenant)
    return [
        AssetCheckResult(**lag_check(lag)),
        AssetCheckResult(check_name=NO_DUPLICATE_PRIMARY_IDS, passed=duplicates == 0, metadata={"duplicate_rows": duplicates, "rows": rows}),
    ]
