"""Snapshot backfill in Dagster: profile_backfill, one partition per tenant; each run loads a hot-store
export up to a time boundary into the tenant's raw table (profile_raw's partition), under the tenant lock."""

from dagster import (
    AssetExecutionContext,
    AssetMaterialization,
    AssetSelection,
    Config,
    MaterializeResult,
    asset,
    define_asset_job,
    in_process_executor,
)

from engagement_platform.orchestration.parts import Parts
from engagement_platform.orchestration.runs import report_table_commits
from engagement_platform.profiles.assets import BACKFILL_ASSET, GROUP, RAW_ASSET, profile_tenants, tenant_locked
from engagement_platform.profiles.backfill.apply import backfill_stream, backfill_tenant
from engagement_platform.profiles.tables import QUARANTINE_PROFILE_CDC, raw_table_name
from engagement_platform.resources import CoordinatorResource, LakeResource, SparkResource


class BackfillConfig(Config):
    """A snapshot export of the hot store for the run's tenant (the partition)."""

    path: str  # a folder of JSON lines / Parquet files, or one file
    until: str  # ISO time boundary: rows with a later cdc_ts are left to CDC


@asset(key=BACKFILL_ASSET, partitions_def=profile_tenants, group_name=GROUP, kinds={"spark", "deltalake"})
def profile_backfill(
    context: AssetExecutionContext,
    config: BackfillConfig,
    spark: SparkResource,
    lake: LakeResource,
    coordinator: CoordinatorResource,
) -> MaterializeResult:
    """Snapshot backfills of one tenant: each run loads a hot-store export up to a time boundary into the
    tenant's raw table, exactly once, under the tenant lock."""
    tenant = context.partition_key
    result = tenant_locked(
        context,
        coordinator,
        spark,
        tenant,
        f"{backfill_stream(tenant)}/{context.run_id[:8]}",
        lambda: backfill_tenant(
            spark.spark_session, lake.lake, coordinator.checkpoints, tenant, config.path, config.until
        ),
    )
    meta = result.metadata()
    raw_version = result.versions.get(raw_table_name(tenant))
    if raw_version is not None:  # the raw table is profile_raw's partition: report it there
        context.log_event(
            AssetMaterialization(
                asset_key=RAW_ASSET,
                partition=tenant,
                description=f"backfill batch {result.plan.batch_id}",
                metadata={"table_version": raw_version, "stream": backfill_stream(tenant), **meta},
            )
        )
    report_table_commits(
        context,
        backfill_stream(tenant),
        result.plan.batch_id,
        {k: v for k, v in result.versions.items() if k == QUARANTINE_PROFILE_CDC.name},
    )
    return MaterializeResult(metadata=meta)


profile_backfill_job = define_asset_job(
    "profile_backfill_job",
    selection=AssetSelection.assets(BACKFILL_ASSET),
    partitions_def=profile_tenants,
    executor_def=in_process_executor,
    description="Load a hot-store snapshot export (path, time boundary in the run config) into a tenant's raw table, under the tenant lock.",
)
BACKFILL = Parts(assets=[profile_backfill], jobs=[profile_backfill_job])
