"""Sensor of the ingestion stream: plans the next Kafka slice and requests its run.

Batches commit strictly in order (their ids are the Delta txn versions), so at most one is in
flight. A batch whose run failed is requested again with the same plan, up to MAX_ATTEMPTS; after
that the stream stops with a SkipReason until someone re-executes that partition.
"""


import json

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from engagement_platform.engagement.assets import topic_observation
from engagement_platform.engagement.ingestion import STREAM
from engagement_platform.engagement.jobs import STREAM_TAG, ingestion_job
from engagement_platform.engagement.partitions import ingestion_batches
from engagement_platform.resources import KafkaResource, LakeResource
from engagement_platform.settings import load_settings
from engagement_platform.streams.planning import BatchPlan, plan_next_batch

MAX_ATTEMPTS = 3
UNFINISHED = {
    DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING,
}
FAILED = {DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


def _request(plan: BatchPlan, attempt: int) -> RunRequest:
    return RunRequest(
        # The first attempt's key is the slice itself; a retry appends the attempt number, which is
        # derived from the failed runs recorded for this partition, not from the clock.
        run_key=plan.run_key if attempt == 1 else f"{plan.run_key}#attempt{attempt}",
        partition_key=plan.partition_key,
        tags={STREAM_TAG: STREAM, "engagement/batch_id": str(plan.batch_id), "engagement/records": str(plan.record_count)},
    )


def _cursor(plan: BatchPlan) -> str:
    return json.dumps({"batch_id": plan.batch_id, "next_offsets": {str(p): e for p, e in plan.ends().items()}})


@sensor(job=ingestion_job, minimum_interval_seconds=5, default_status=DefaultSensorStatus.RUNNING)
def engagement_ingestion_sensor(context: SensorEvaluationContext, kafka: KafkaResource, lake: LakeResource):
    """Plans the next offset slice of engagement.activities when the previous batch is done."""
    store = lake.checkpoints
    latest, done = store.latest(STREAM)
    if latest is not None and not done:
        runs = context.instance.get_runs(filters=RunsFilter(tags={"dagster/partition": latest.partition_key, STREAM_TAG: STREAM}))
        if any(r.status in UNFINISHED for r in runs):
            return SkipReason(f"batch {latest.batch_id} is in flight")
        failed = sum(r.status in FAILED for r in runs)
        if failed >= MAX_ATTEMPTS:
            return SkipReason(f"batch {latest.batch_id} failed {failed} times; stream paused until partition {latest.partition_key} is re-executed")
        return SensorResult(
            run_requests=[_request(latest, failed + 1)],
            dynamic_partitions_requests=[ingestion_batches.build_add_request([latest.partition_key])],
            cursor=_cursor(latest),
        )

    settings = load_settings()
    topic = settings.activities_topic
    watermarks = kafka.client.watermarks(topic)
    plan = plan_next_batch(STREAM, topic, latest, watermarks, settings.ingest_max_records_per_partition)
    if plan is None:
        return SensorResult(
            skip_reason=f"no new messages on {topic} (high watermarks {dict(sorted((p, h) for p, (_, h) in watermarks.items()))})",
            asset_events=[topic_observation(watermarks)],
        )
    store.record_plan(plan)
    return SensorResult(
        run_requests=[_request(plan, 1)],
        asset_events=[topic_observation(watermarks)],
        dynamic_partitions_requests=[ingestion_batches.build_add_request([plan.partition_key])],
        cursor=_cursor(plan),
    )
