"""Checks of a tenant's raw table: replication lag under the threshold and no duplicate primary ids, after
each merge; and the replication lag of every tenant, evaluated every minute by the lag sensor
(freshness-style: it fails while no run happens too). Each emits the numbers it measured.

The minute-by-minute check is one check of `profile_progress` (unpartitioned), not the tenant partitions'
check: Dagster stores an evaluation reported outside a run once per check and partition, so a second
sensor-reported evaluation of a partition's check fails the whole tick (a unique index of
asset_check_executions), while unpartitioned ones accumulate like any history."""

from __future__ import annotations

from collections.abc import Mapping

from dagster import AssetCheckEvaluation, AssetCheckResult, AssetCheckSpec, AssetKey, asset_check

from engagement_platform.lake.delta import DeltaLake
from engagement_platform.profiles.assets import profile_tenants
from engagement_platform.profiles.integrity import duplicate_primary_ids
from engagement_platform.profiles.lag import TenantLag, tenant_lags
from engagement_platform.profiles.tables import PROFILE_PROGRESS
from engagement_platform.resources import LakeResource
from engagement_platform.settings import load_settings

REPLICATION_LAG_UNDER_THRESHOLD = "replication_lag_under_threshold"
NO_DUPLICATE_PRIMARY_IDS = "no_duplicate_primary_ids"
EVERY_TENANT_LAG_UNDER_THRESHOLD = "every_tenant_replication_lag_under_threshold"
PROGRESS_ASSET = AssetKey(PROFILE_PROGRESS.name)


def raw_check_specs(asset: AssetKey) -> list[AssetCheckSpec]:
    # Evaluated after the tenant's merge is committed: audits of the committed table, not blocking.
    return [
        AssetCheckSpec(
            REPLICATION_LAG_UNDER_THRESHOLD,
            asset=asset,
            description="Newest staged CDC time minus newest merged CDC time of the tenant is under "
            "EP_PROFILE_MAX_LAG_SECONDS (also evaluated every minute by profile_lag_sensor).",
        ),
        AssetCheckSpec(
            NO_DUPLICATE_PRIMARY_IDS, asset=asset, description="No primary id appears twice in the tenant's raw table."
        ),
    ]


def lag_check(lag: TenantLag, threshold: float | None = None) -> dict:
    """The lag check's outcome as AssetCheckResult / AssetCheckEvaluation keyword arguments."""
    threshold = load_settings().profiles.max_lag_seconds if threshold is None else threshold
    return {
        "check_name": REPLICATION_LAG_UNDER_THRESHOLD,
        "passed": lag.replication_lag_seconds <= threshold,
        "metadata": {"tenant": lag.tenant, "max_lag_seconds": threshold, **lag.metadata()},
    }


def evaluate_raw_checks(lake: DeltaLake, tenant: str, lag: TenantLag) -> list[AssetCheckResult]:
    duplicates, rows = duplicate_primary_ids(lake, tenant)
    return [
        AssetCheckResult(**lag_check(lag)),
        AssetCheckResult(
            check_name=NO_DUPLICATE_PRIMARY_IDS,
            passed=duplicates == 0,
            metadata={"duplicate_rows": duplicates, "rows": rows},
        ),
    ]


def evaluate_range_checks(lake: DeltaLake, lags: Mapping[str, TenantLag]) -> list[AssetCheckResult]:
    """The raw checks of a run of several tenants: one result per check over all of them (Dagster keeps one
    evaluation per check and run), passed when it passes for every tenant; the worst tenant and the sums as
    metadata. A run of one tenant gets evaluate_raw_checks' results."""
    if len(lags) == 1:
        ((tenant, lag),) = lags.items()
        return evaluate_raw_checks(lake, tenant, lag)
    lag_outcome = every_tenant_lag(lags)
    lag_outcome["metadata"] = {k: v for k, v in lag_outcome["metadata"].items() if not k.startswith(tuple(lags))}
    counted = {tenant: duplicate_primary_ids(lake, tenant) for tenant in lags}
    with_duplicates = sorted(t for t, (duplicates, _) in counted.items() if duplicates)
    return [
        AssetCheckResult(**{**lag_outcome, "check_name": REPLICATION_LAG_UNDER_THRESHOLD}),
        AssetCheckResult(
            check_name=NO_DUPLICATE_PRIMARY_IDS,
            passed=not with_duplicates,
            metadata={
                "tenants": len(counted),
                "duplicate_rows": sum(d for d, _ in counted.values()),
                "rows": sum(r for _, r in counted.values()),
                "tenants_with_duplicates": ", ".join(with_duplicates),
            },
        ),
    ]


def every_tenant_lag(lags: Mapping[str, TenantLag], threshold: float | None = None) -> dict:
    """The every-tenant lag check's outcome as AssetCheckResult / AssetCheckEvaluation keyword arguments:
    passed while no tenant lags more than the threshold; the worst lag and each tenant's figures as metadata."""
    threshold = load_settings().profiles.max_lag_seconds if threshold is None else threshold
    over = sorted(t for t, lag in lags.items() if lag.replication_lag_seconds > threshold)
    worst = max(lags.values(), key=lambda lag: lag.replication_lag_seconds, default=None)
    metadata = {
        "tenants": len(lags),
        "tenants_over_threshold": len(over),
        "max_lag_seconds": threshold,
        "worst_replication_lag_seconds": worst.replication_lag_seconds if worst else 0.0,
        "worst_tenant": worst.tenant if worst else "",
        "over_threshold": ", ".join(over),
    }
    for tenant, lag in sorted(lags.items()):
        metadata.update({f"{tenant}_{k}": v for k, v in lag.metadata().items()})
    return {"check_name": EVERY_TENANT_LAG_UNDER_THRESHOLD, "passed": not over, "metadata": metadata}


@asset_check(
    asset=PROGRESS_ASSET,
    name=EVERY_TENANT_LAG_UNDER_THRESHOLD,
    description="No tenant's newest staged CDC time is more than EP_PROFILE_MAX_LAG_SECONDS ahead of its newest merged "
    "one; evaluated every minute by profile_lag_sensor, and on demand.",
)
def every_tenant_lag_check(context, lake: LakeResource) -> AssetCheckResult:  # context: AssetCheckExecutionContext
    tenants = sorted(context.instance.get_dynamic_partitions(profile_tenants.name))
    return AssetCheckResult(**every_tenant_lag(tenant_lags(lake.lake, tenants)))


def every_tenant_lag_evaluation(lags: Mapping[str, TenantLag]) -> AssetCheckEvaluation:
    """What the lag sensor reports each minute (outside any run)."""
    return AssetCheckEvaluation(asset_key=PROGRESS_ASSET, **every_tenant_lag(lags))
