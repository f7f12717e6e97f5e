"""The profile processor in Dagster: profile_raw, one partition per tenant (one Delta table per tenant);
a run covers one tenant or a range of tenant partitions (the sensor groups tenants with work, up to
EP_PROFILE_TENANTS_PER_RUN), merges everything staged for them since their last batches under their tenant
locks, then evaluates their segments (profile_segments) in the same process: a run's fixed cost (a process,
Dagster's set-up and events) is paid once per group of tenants, not once per tenant and job."""

from confluent_kafka import KafkaException
from dagster import (
    AllPartitionMapping,
    AssetDep,
    AssetExecutionContext,
    AssetMaterialization,
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
    tenants_metadata,
)
from engagement_platform.profiles.lag import staged_offsets, tenant_lags
from engagement_platform.profiles.processor.apply import process_tenants, processor_group_stream, processor_stream
from engagement_platform.profiles.processor.checks import evaluate_range_checks, raw_check_specs
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
    string, related ids of its identity-graph component; each run merges everything staged since the last.
    A run covers one tenant or a range of them (the sensor groups them): one Spark pass, each tenant its own batch."""
    tenants = list(context.partition_keys)
    owner = f"{processor_group_stream(tenants)}/{context.run_id[:8]}"
    results = tenant_locked(
        context,
        coordinator,
        spark,
        tenants,
        owner,
        lambda: process_tenants(spark.spark_session, lake.lake, coordinator.checkpoints, tenants),
    )
    if len(results) == 1:
        ((tenant, result),) = results.items()
        report_table_commits(
            context,
            processor_stream(tenant),
            result.plan.batch_id,
            {k: v for k, v in result.versions.items() if k == PROFILE_PROGRESS.name},
        )
    elif results:  # the tenants' progress rows went in one commit: one materialization of the table says so
        versions = {r.versions.get(PROFILE_PROGRESS.name) for r in results.values()} - {None}
        context.log_event(
            AssetMaterialization(
                asset_key=PROFILE_PROGRESS.name,
                description=f"{processor_group_stream(tenants)}: {len(results)} tenants' batches",
                metadata={
                    "tenants": len(results),
                    "table_version": max(versions) if versions else "already committed",
                    "stream": processor_group_stream(tenants),
                },
            )
        )
    lags = tenant_lags(lake.lake, tenants)
    try:  # the merge is committed: a broker away now costs the topic's lag figures, not a failed run
        cdc_lag = cdc_lag_metadata(
            kafka.client.watermarks(load_settings().profiles.cdc_topic), staged_offsets(lake.checkpoints)
        )
    except KafkaException as e:
        if unavailable_service(e) is None:
            raise
        cdc_lag = {"cdc_lag_unavailable": str(e)[:300]}

    def tenant_metadata(tenant: str) -> dict:
        result = results.get(tenant)
        return {**(result.metadata() if result else {"tenant": tenant, "changes_read": 0}), **lags[tenant].metadata()}

    run_wide = {**cdc_lag, **stranded_metadata(context)}
    if len(tenants) > 1:
        run_wide["tenants_merged"] = len(results)
    return MaterializeResult(
        metadata=tenants_metadata(context, tenants, tenant_metadata, run_wide),
        check_results=evaluate_range_checks(lake.lake, lags),
    )


# Runs carry STREAM_TAG = processor_group_stream(tenants) (from the sensor); the sensor never requests a tenant that a
# run in flight covers, and the tenant locks keep two runs of one tenant apart in any case.
profile_processor_job = define_asset_job(
    PROCESSOR_JOB,
    selection=AssetSelection.assets(RAW_ASSET, SEGMENTS_ASSET),
    partitions_def=profile_tenants,
    executor_def=in_process_executor,
    description="Merge the staged CDC changes of a tenant, or of a range of tenants, into their raw tables under "
    "the tenant locks, then evaluate their segments.",
)
