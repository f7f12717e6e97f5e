"""Sensors of the Kafka-fed streams (ingestion, mutation, retention): plan the next slice and request its run.

One batch in flight at a time, retried with the same plan after a failure (batch_dagster.py).
"""


import json

from dagster import AssetKey, DefaultSensorStatus, DynamicPartitionsDefinition, SensorEvaluationContext, SensorResult, SkipReason, sensor

from engagement_platform.batch_dagster import resume_unfinished, run_request
from engagement_platform.engagement import mutations, retention
from engagement_platform.engagement.assets import GDPR_TOPIC_ASSET, MUTATIONS_TOPIC_ASSET, TOPIC_ASSET, topic_observation
from engagement_platform.engagement.ingestion import STREAM
from engagement_platform.engagement.jobs import ingestion_job, mutation_job, retention_job
from engagement_platform.engagement.partitions import ingestion_batches, mutation_batches, retention_batches
from engagement_platform.resources import CoordinatorResource, KafkaResource
from engagement_platform.settings import load_settings
from engagement_platform.streams.planning import BatchPlan, plan_next_batch


def _tags(plan: BatchPlan) -> dict[str, str]:
    return {"engagement/records": str(plan.record_count)}


def _cursor(plan: BatchPlan) -> str:
    return json.dumps({"batch_id": plan.batch_id, "next_offsets": {str(p): e for p, e in plan.ends().items()}})


def kafka_stream_tick(context: SensorEvaluationContext, kafka: KafkaResource, coordinator: CoordinatorResource, stream: str, topic: str,
                      partitions: DynamicPartitionsDefinition, topic_key: AssetKey):
    """One tick of a Kafka-fed stream: resume the unfinished batch, or plan the next slice."""
    store = coordinator.checkpoints
    latest, done = store.latest(stream)
    if latest is not None and not done:
        return resume_unfinished(context, latest, partitions, _tags, _cursor(latest),
                                 lambda plan: coordinator.predecessor_wait(plan.stream, plan.batch_id))
    watermarks = kafka.client.watermarks(topic)
    plan = plan_next_batch(stream, topic, latest, watermarks, load_settings().ingest_max_records_per_partition)
    observed = [topic_observation(watermarks, topic_key)]
    if plan is None:
        return SensorResult(
            skip_reason=f"no new messages on {topic} (high watermarks {dict(sorted((p, h) for p, (_, h) in watermarks.items()))})",
            asset_events=observed,
        )
    store.record_plan(plan)
    return SensorResult(
        run_requests=[run_request(plan, 1, _tags(plan))],
        asset_events=observed,
        dynamic_partitions_requests=[partitions.build_add_request([plan.partition_key])],
        cursor=_cursor(plan),
    )


@sensor(job=ingestion_job, minimum_interval_seconds=5, default_status=DefaultSensorStatus.RUNNING)
def engagement_ingestion_sensor(context: SensorEvaluationContext, kafka: KafkaResource, coordinator: CoordinatorResource):
    """Plans the next offset slice of engagement.activities when the previous batch is done."""
    return kafka_stream_tick(context, kafka, coordinator, STREAM, load_settings().activities_topic, ingestion_batches, TOPIC_ASSET)


@sensor(job=mutation_job, minimum_interval_seconds=5, default_status=DefaultSensorStatus.RUNNING)
def engagement_mutation_sensor(context: SensorEvaluationContext, kafka: KafkaResource, coordinator: CoordinatorResource):
    """Plans the next slice of engagement.mutations when the previous mutation batch is done.

    Pending requests are retried with the next batch of requests (not on their own yet)."""
    return kafka_stream_tick(context, kafka, coordinator, mutations.STREAM, mutations.mutations_topic(), mutation_batches, MUTATIONS_TOPIC_ASSET)


@sensor(job=retention_job, minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING)
def engagement_retention_sensor(context: SensorEvaluationContext, kafka: KafkaResource, coordinator: CoordinatorResource):
    """Plans the next slice of engagement.gdpr (retention and erasure requests) once per
    EP_RETENTION_INTERVAL_SECONDS (default daily, read at run time) after the previous batch was planned."""
    interval = retention.interval_seconds()
    wait = retention.seconds_until_due(coordinator.checkpoints, interval)
    if wait > 0:
        return SkipReason(f"next retention batch due in {wait:.0f}s (cadence {interval}s, EP_RETENTION_INTERVAL_SECONDS)")
    return kafka_stream_tick(context, kafka, coordinator, retention.STREAM, retention.gdpr_topic(), retention_batches, GDPR_TOPIC_ASSET)
