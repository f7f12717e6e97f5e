"""Sensors of the profile CDC lake: the dumper (plans Kafka slices), the processor (one run per tenant
with unmerged staged changes) and the lag monitor (the replication lag check, every minute)."""

from __future__ import annotations

import json

from dagster import (
    AssetCheckEvaluation,
    AssetObservation,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from engagement_platform.orchestration.runs import COORDINATION_TAG, FAILED, MAX_ATTEMPTS, STREAM_TAG, UNFINISHED
from engagement_platform.engagement.assets import watermark_metadata
from engagement_platform.engagement.sensors import kafka_stream_tick
from engagement_platform.profiles.assets import RAW_ASSET, TOPIC_ASSET, cdc_lag_metadata
from engagement_platform.profiles.checks import lag_check
from engagement_platform.profiles.jobs import profile_cdc_staging_job, profile_processor_job
from engagement_platform.profiles.lag import profile_cdc_topic, staged_offsets, tenant_lags
from engagement_platform.profiles.partitions import profile_cdc_batches, profile_tenants
from engagement_platform.profiles.processor.apply import processor_stream
from engagement_platform.profiles.processor.progress import latest_progress, unprocessed_tenants
from engagement_platform.profiles.staging.apply import STREAM
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING
from engagement_platform.resources import KafkaResource, LakeResource

STAGING_RANGE_TAG = "profile/staging_versions"  # "<after>-<up to>" as the sensor saw them


@sensor(job=profile_cdc_staging_job, minimum_interval_seconds=5, default_status=DefaultSensorStatus.RUNNING)
def profile_cdc_dumper_sensor(context: SensorEvaluationContext, kafka: KafkaResource, lake: LakeResource):
    """Plans the next offset slice of profile.cdc when the previous dumper batch is done."""
    topic = profile_cdc_topic()
    staged = staged_offsets(lake.checkpoints)  # before this tick's plan: what is really staged
    result = kafka_stream_tick(context, kafka, lake, STREAM, topic, profile_cdc_batches, TOPIC_ASSET)
    if isinstance(result, SensorResult) and result.asset_events:  # the topic observation, plus its lag
        marks = kafka.client.watermarks(topic)
        observed = AssetObservation(asset_key=TOPIC_ASSET, metadata={**watermark_metadata(marks), **cdc_lag_metadata(marks, staged)})
        return SensorResult(run_requests=result.run_requests, skip_reason=result.skip_reason, cursor=result.cursor,
                            dynamic_partitions_requests=result.dynamic_partitions_requests, asset_events=[observed])
    return result


def processor_run_key(tenant: str, after: int, up_to: int, attempt: int) -> str:
    """From the tenant and the staging versions it has to merge, never from the clock."""
    key = f"{processor_stream(tenant)}/staging[{after + 1}..{up_to}]"
    return key if attempt == 1 else f"{key}#attempt{attempt}"


@sensor(job=profile_processor_job, minimum_interval_seconds=10, default_status=DefaultSensorStatus.RUNNING)
def profile_processor_sensor(context: SensorEvaluationContext, lake: LakeResource):
    """Requests one processor run per tenant whose staged changes are not all merged into its raw table."""
    store = lake.lake
    tenants = unprocessed_tenants(store)
    if not tenants:
        return SkipReason("every tenant's staged changes are merged")
    current = store.table(PROFILE_CDC_STAGING.name).version()
    progress = {t: r["staging_version"] for t, r in latest_progress(store).items()}
    instance = context.instance
    running = instance.get_runs(filters=RunsFilter(job_name=profile_processor_job.name, statuses=list(UNFINISHED)))
    in_flight = {r.tags.get("dagster/partition") for r in running}
    requests, waiting = [], []
    for tenant in tenants:
        if tenant in in_flight:
            waiting.append(f"{tenant}: in flight")
            continue
        after = progress.get(tenant, -1)
        span = f"{after}-{current}"
        ended = instance.get_runs(filters=RunsFilter(job_name=profile_processor_job.name, statuses=list(FAILED),
                                                     tags={"dagster/partition": tenant, STAGING_RANGE_TAG: span}))
        if sum(COORDINATION_TAG not in r.tags for r in ended) >= MAX_ATTEMPTS:  # lock give-ups are not the batch's fault
            waiting.append(f"{tenant}: failed {MAX_ATTEMPTS} times on staging versions {span}, paused until re-executed")
            continue
        requests.append(RunRequest(run_key=processor_run_key(tenant, after, current, len(ended) + 1), partition_key=tenant,
                                   tags={STREAM_TAG: processor_stream(tenant), STAGING_RANGE_TAG: span}))
    known = set(instance.get_dynamic_partitions(profile_tenants.name))
    new = [t for t in tenants if t not in known]
    cursor = json.dumps({"staging_version": current, "tenants": {t: progress.get(t, -1) for t in tenants}})
    return SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[profile_tenants.build_add_request(new)] if new else [],
        skip_reason=None if requests else "; ".join(waiting),
        cursor=cursor,
    )


@sensor(minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING)
def profile_lag_sensor(context: SensorEvaluationContext, kafka: KafkaResource, lake: LakeResource):
    """Every minute, per tenant: replication lag as the `replication_lag_under_threshold` check of its
    profile_raw partition (freshness-style: it fails even while no run happens), and the topic's CDC lag."""
    tenants = sorted(context.instance.get_dynamic_partitions(profile_tenants.name))
    lags = tenant_lags(lake.lake, tenants)
    marks = kafka.client.watermarks(profile_cdc_topic())
    events = [AssetObservation(asset_key=TOPIC_ASSET, metadata={**watermark_metadata(marks), **cdc_lag_metadata(marks, staged_offsets(lake.checkpoints))})]
    events += [AssetCheckEvaluation(asset_key=RAW_ASSET, partition=t, **lag_check(lag)) for t, lag in lags.items()]
    return SensorResult(asset_events=events, skip_reason=None if tenants else "no tenant partitions yet")
