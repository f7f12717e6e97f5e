"""The profile processor in Dagster: profile_raw, one partition per tenant (one Delta table per tenant);
each run merges everything staged for the tenant since its last run, under the tenant lock, then
evaluates the tenant's segments (profile_segments) in the same process: a run's fixed cost (a process,
imports, Dagster set-up: ~2 s) is paid once per tenant and staging batch, not twice."""

from confluent_kafka import KafkaException
from dagster import (
    AllPartitionMapping,
    AssetDep,
    AssetExecutionContext,
    AssetSelection,
    MaterializeResult,
    asset,
    define_asset_job,
    in_process_executor,
)

from engagement_platform.orchestration.orphans import stranded_metadata
from engagement_platform.orchestration.runs import report_table_commits, unavailable_service
from engagement_platform.profiles.assets import (
    BACKFILL_ASSET,
    GROUP,
    PROCESSOR_JOB,
    RAW_ASSET,
    SEGMENTS_ASSET,
    STAGING_ASSET,
    cdc_lag_metadata,
    profile_tenants,
    tenant_locked,
)
from engagement_platform.profiles.lag import staged_offsets, tenant_lags
from engagement_platform.profiles.processor.apply import process_tenant, processor_stream
from engagement_platform.profiles.processor.checks import evaluate_raw_checks, raw_check_specs
from engagement_platform.profiles.tables import PROFILE_PROGRESS
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource
from engagement_platform.settings import load_settings


@asset(
    key=RAW_ASSET,
    deps=[AssetDep(STAGING_ASSET, partition_mapping=AllPartitionMapping()), BACKFILL_ASSET],
    partitions_def=profile_tenants,
    check_specs=raw_check_specs(RAW_ASSET),
    group_name=GROUP,
    kinds={"spark", "deltalake"},
)
def profile_raw(
    context: AssetExecutionContext,
    spark: SparkResource,
    lake: LakeResource,
    kafka: KafkaResource,
    coordinator: CoordinatorResource,
) -> MaterializeResult:
    """Unified profiles of one tenant (one Delta table per tenant): one row per primary id, fields as a JSON
    string, related ids of its identity-graph component; each run merges everything staged since the last."""
    tenant = context.partition_key
    result = tenant_locked(
        context,
        coordinator,
        spark,
        tenant,
        f"{processor_stream(tenant)}/{context.run_id[:8]}",
        lambda: process_tenant(spark.spark_session, lake.lake, coordinator.checkpoints, tenant),
    )
    meta = result.metadata() if result is not None else {"tenant": tenant, "changes_read": 0}
    if result is not None:
        report_table_commits(
            context,
            processor_stream(tenant),
            result.plan.batch_id,
            {k: v for k, v in result.versions.items() if k == PROFILE_PROGRESS.name},
        )
    lag = tenant_lags(lake.lake, [tenant])[tenant]
    try:  # the merge is committed: a broker away now costs the topic's lag figures, not a failed run
        cdc_lag = cdc_lag_metadata(
            kafka.client.watermarks(load_settings().profiles.cdc_topic), staged_offsets(lake.checkpoints)
        )
    except KafkaException as e:
        if unavailable_service(e) is None:
            raise
        cdc_lag = {"cdc_lag_unavailable": str(e)[:300]}
    return MaterializeResult(
        metadata={**meta, **lag.metadata(), **cdc_lag, **stranded_metadata(context)},
        check_results=evaluate_raw_checks(lake.lake, tenant, lag),
    )


# Runs carry STREAM_TAG = profile_processor/<tenant> (from the sensor): one run per tenant at a time.
profile_processor_job = define_asset_job(
    PROCESSOR_JOB,
    selection=AssetSelection.assets(RAW_ASSET, SEGMENTS_ASSET),
    partitions_def=profile_tenants,
    executor_def=in_process_executor,
    description="Merge a tenant's staged CDC changes into its raw table, under the tenant lock, then evaluate its segments.",
)
