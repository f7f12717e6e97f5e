"""Checks of a tenant's raw table: replication lag under the threshold (also evaluated every minute by
the lag sensor, freshness-style) and no duplicate primary ids. Each emits the numbers it measured."""

from __future__ import annotations

from dagster import AssetCheckResult, AssetCheckSpec, AssetKey

from engagement_platform.lake.delta import DeltaLake
from engagement_platform.profiles.integrity import duplicate_primary_ids
from engagement_platform.profiles.lag import TenantLag
from engagement_platform.settings import load_settings

REPLICATION_LAG_UNDER_THRESHOLD = "replication_lag_under_threshold"
NO_DUPLICATE_PRIMARY_IDS = "no_duplicate_primary_ids"


def raw_check_specs(asset: AssetKey) -> list[AssetCheckSpec]:
    # Evaluated after the tenant's merge is committed: audits of the committed table, not blocking.
    return [
        AssetCheckSpec(REPLICATION_LAG_UNDER_THRESHOLD, asset=asset,
                       description="Newest staged CDC time minus newest merged CDC time of the tenant is under "
                                   "EP_PROFILE_MAX_LAG_SECONDS (also evaluated every minute by profile_lag_sensor)."),
        AssetCheckSpec(NO_DUPLICATE_PRIMARY_IDS, asset=asset, description="No primary id appears twice in the tenant's raw table."),
    ]


def lag_check(lag: TenantLag, threshold: float | None = None) -> dict:
    """The lag check's outcome as AssetCheckResult / AssetCheckEvaluation keyword arguments."""
    threshold = load_settings().profiles.max_lag_seconds if threshold is None else threshold
    return {"check_name": REPLICATION_LAG_UNDER_THRESHOLD, "passed": lag.replication_lag_seconds <= threshold,
            "metadata": {"tenant": lag.tenant, "max_lag_seconds": threshold, **lag.metadata()}}


def evaluate_raw_checks(lake: DeltaLake, tenant: str, lag: TenantLag) -> list[AssetCheckResult]:
    duplicates, rows = duplicate_primary_ids(lake, tenant)
    return [
        AssetCheckResult(**lag_check(lag)),
        AssetCheckResult(check_name=NO_DUPLICATE_PRIMARY_IDS, passed=duplicates == 0, metadata={"duplicate_rows": duplicates, "rows": rows}),
    ]
