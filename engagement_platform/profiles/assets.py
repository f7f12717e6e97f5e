"""Assets of the unified-profile CDC lake.

kafka/profile_cdc -> profile_cdc_staging (dumper: one partition per planned offset slice)
                  -> profile_raw (processor: one partition per tenant = one Delta table per tenant)
profile_backfill (one partition per tenant, config: export path + time boundary) -> profile_raw

The staging table has one writer, so the dumper stream *is* the staging asset. The raw tables have
two writers (processor and backfill) and an asset key has one producer: the processor owns
`profile_raw`, the backfill is its own asset upstream of it and reports a `profile_raw`
materialization of the tenant for every commit it makes. Both take the tenant lock.
"""


from collections.abc import Iterator
from contextlib import contextmanager

from dagster import (
    AllPartitionMapping,
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    Config,
    DataVersion,
    Failure,
    MaterializeResult,
    ObserveResult,
    asset,
    observable_source_asset,
)

from engagement_platform.orchestration.runs import COORDINATION_TAG, report_table_commits
from engagement_platform.engagement.assets import watermark_metadata
from engagement_platform.profiles.backfill.apply import backfill_stream, backfill_tenant
from engagement_platform.profiles.checks import evaluate_raw_checks, evaluate_staging_checks, raw_check_specs, staging_check_specs
from engagement_platform.profiles.lag import profile_cdc_topic, staged_offsets, tenant_lags, topic_lag
from engagement_platform.profiles.locks import tenant_lock
from engagement_platform.profiles.partitions import profile_cdc_batches, profile_tenants
from engagement_platform.profiles.processor.apply import process_tenant, processor_stream
from engagement_platform.profiles.staging.apply import STREAM, stage_cdc_batch
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, PROFILE_PROGRESS, QUARANTINE_PROFILE_CDC, raw_table_name
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource
from engagement_platform.streams.coordinator import CoordinationGaveUp, Lease, LeaseLost

GROUP = "profiles"
TOPIC_ASSET = AssetKey(["kafka", "profile_cdc"])
STAGING_ASSET = AssetKey(PROFILE_CDC_STAGING.name)
RAW_ASSET = AssetKey("profile_raw")
BACKFILL_ASSET = AssetKey("profile_backfill")


def cdc_lag_metadata(watermarks: dict[int, tuple[int, int]], staged: dict[int, int]) -> dict:
    lag = topic_lag(watermarks, staged)
    return {"cdc_lag_messages": sum(lag.values()), **{f"partition_{p}_lag": n for p, n in lag.items()}}


@observable_source_asset(key=TOPIC_ASSET, group_name=GROUP,
                         description="Kafka topic of unified-profile CDC changes from the hot store (EP_PROFILE_CDC_TOPIC).")
def profile_cdc_topic_asset(kafka: KafkaResource, lake: LakeResource) -> ObserveResult:
    marks = kafka.client.watermarks(profile_cdc_topic())
    return ObserveResult(data_version=DataVersion(str(sum(h for _, h in marks.values()))),
                         metadata={**watermark_metadata(marks), **cdc_lag_metadata(marks, staged_offsets(lake.checkpoints))})


@asset(key=STAGING_ASSET, deps=[TOPIC_ASSET], partitions_def=profile_cdc_batches, check_specs=staging_check_specs(STAGING_ASSET),
       group_name=GROUP, kinds={"spark", "deltalake", "kafka"})
def profile_cdc_staging(context: AssetExecutionContext, spark: SparkResource, lake: LakeResource, kafka: KafkaResource) -> MaterializeResult:
    """Every tenant's profile CDC changes as staged from Kafka, append-only, by tenant and 15-minute bucket;
    each partition is one planned offset slice, appended exactly once."""
    # No lock: the dumper only appends (delta-rs never fails a blind append on a concurrent commit) and
    # nothing rewrites staging; exactly-once comes from the batch's txn, order from one run per stream.
    plan = lake.checkpoints.plan(STREAM, int(context.partition_key))
    result = stage_cdc_batch(spark.spark_session, lake.lake, lake.checkpoints, kafka.servers, plan)
    report_table_commits(context, STREAM, plan.batch_id, {k: v for k, v in result.versions.items() if k != PROFILE_CDC_STAGING.name})
    return MaterializeResult(metadata=result.metadata(), check_results=evaluate_staging_checks(lake.lake, result))


@contextmanager
def tenant_locked(context: AssetExecutionContext, coordinator: CoordinatorResource, tenant: str, owner: str) -> Iterator[Lease | None]:
    """The tenant lock for the block (commits fenced); a give-up or a lost lease fails the run tagged
    COORDINATION_TAG with nothing (more) committed: the next sensor tick asks again."""
    zk = coordinator.coordinator() if coordinator.is_enabled else None
    try:
        with tenant_lock(zk, tenant, owner, coordinator.lock_timeout_s) as lease:
            if lease is not None:
                context.log.info(f"{owner}: holding {lease}")
            yield lease
    except (CoordinationGaveUp, LeaseLost) as e:
        outcome = "gave_up" if isinstance(e, CoordinationGaveUp) else "lease_lost"
        context.instance.add_run_tags(context.run_id, {COORDINATION_TAG: outcome})
        raise Failure(description=f"{owner}: tenant lock {outcome.replace('_', ' ')}: {e}. Nothing more was committed.",
                      metadata={"coordination": outcome, "reason": str(e), "tenant": tenant}, allow_retries=False) from e


@asset(key=RAW_ASSET, deps=[AssetDep(STAGING_ASSET, partition_mapping=AllPartitionMapping()), BACKFILL_ASSET],
       partitions_def=profile_tenants, check_specs=raw_check_specs(RAW_ASSET), group_name=GROUP, kinds={"spark", "deltalake"})
def profile_raw(context: AssetExecutionContext, spark: SparkResource, lake: LakeResource, kafka: KafkaResource,
                coordinator: CoordinatorResource) -> MaterializeResult:
    """Unified profiles of one tenant (one Delta table per tenant): one row per primary id, fields as a JSON
    string, related ids of its identity-graph component; each run merges everything staged since the last."""
    tenant = context.partition_key
    with tenant_locked(context, coordinator, tenant, f"{processor_stream(tenant)}/{context.run_id[:8]}"):
        result = process_tenant(spark.spark_session, lake.lake, coordinator.checkpoints, tenant)
    meta = result.metadata() if result is not None else {"tenant": tenant, "changes_read": 0}
    if result is not None:
        report_table_commits(context, processor_stream(tenant), result.plan.batch_id,
                             {k: v for k, v in result.versions.items() if k == PROFILE_PROGRESS.name})
    lag = tenant_lags(lake.lake, [tenant])[tenant]
    marks = kafka.client.watermarks(profile_cdc_topic())
    return MaterializeResult(metadata={**meta, **lag.metadata(), **cdc_lag_metadata(marks, staged_offsets(lake.checkpoints))},
                             check_results=evaluate_raw_checks(lake.lake, tenant, lag))


class BackfillConfig(Config):
    """A snapshot export of the hot store for the run's tenant (the partition)."""

    path: str  # a folder of JSON lines / Parquet files, or one file
    until: str  # ISO time boundary: rows with a later cdc_ts are left to CDC


@asset(key=BACKFILL_ASSET, partitions_def=profile_tenants, group_name=GROUP, kinds={"spark", "deltalake"})
def profile_backfill(context: AssetExecutionContext, config: BackfillConfig, spark: SparkResource, lake: LakeResource,
                     coordinator: CoordinatorResource) -> MaterializeResult:
    """Snapshot backfills of one tenant: each run loads a hot-store export up to a time boundary into the
    tenant's raw table, exactly once, under the tenant lock."""
    tenant = context.partition_key
    with tenant_locked(context, coordinator, tenant, f"{backfill_stream(tenant)}/{context.run_id[:8]}"):
        result = backfill_tenant(spark.spark_session, lake.lake, coordinator.checkpoints, tenant, config.path, config.until)
    meta = result.metadata()
    raw_version = result.versions.get(raw_table_name(tenant))
    if raw_version is not None:  # the raw table is profile_raw's partition: report it there
        context.log_event(AssetMaterialization(asset_key=RAW_ASSET, partition=tenant, description=f"backfill batch {result.plan.batch_id}",
                                               metadata={"table_version": raw_version, "stream": backfill_stream(tenant), **meta}))
    report_table_commits(context, backfill_stream(tenant), result.plan.batch_id,
                         {k: v for k, v in result.versions.items() if k == QUARANTINE_PROFILE_CDC.name})
    return MaterializeResult(metadata=meta)


profile_tables = [
    AssetSpec(key=PROFILE_PROGRESS.name, deps=[RAW_ASSET], group_name=GROUP, kinds={"deltalake"},
              description="Progress map: per tenant and processor batch, the staging versions and buckets merged into its raw table."),
    AssetSpec(key=QUARANTINE_PROFILE_CDC.name, deps=[STAGING_ASSET, BACKFILL_ASSET], group_name=GROUP, kinds={"deltalake"},
              description="CDC records and snapshot rows that never reached a table: raw bytes, topic:partition:offset or file:line, reason."),
]
