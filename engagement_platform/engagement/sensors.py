"""Sensor of the ingestion stream: plans the next Kafka slice and requests its run.

One batch in flight at a time, retried with the same plan after a failure (batch_sensors.py).
"""


import json

from dagster import DefaultSensorStatus, SensorEvaluationContext, SensorResult, sensor

from engagement_platform.batch_sensors import resume_unfinished, run_request
from engagement_platform.engagement.assets import topic_observation
from engagement_platform.engagement.ingestion import STREAM
from engagement_platform.engagement.jobs import ingestion_job
from engagement_platform.engagement.partitions import ingestion_batches
from engagement_platform.resources import KafkaResource, LakeResource
from engagement_platform.settings import load_settings
from engagement_platform.streams.planning import BatchPlan, plan_next_batch


def _tags(plan: BatchPlan) -> dict[str, str]:
    return {"engagement/records": str(plan.record_count)}


def _cursor(plan: BatchPlan) -> str:
    return json.dumps({"batch_id": plan.batch_id, "next_offsets": {str(p): e for p, e in plan.ends().items()}})


@sensor(job=ingestion_job, minimum_interval_seconds=5, default_status=DefaultSensorStatus.RUNNING)
def engagement_ingestion_sensor(context: SensorEvaluationContext, kafka: KafkaResource, lake: LakeResource):
    """Plans the next offset slice of engagement.activities when the previous batch is done."""
    store = lake.checkpoints
    latest, done = store.latest(STREAM)
    if latest is not None and not done:
        return resume_unfinished(context, latest, ingestion_batches, _tags, _cursor(latest))

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
        run_requests=[run_request(plan, 1, _tags(plan))],
        asset_events=[topic_observation(watermarks)],
        dynamic_partitions_requests=[ingestion_batches.build_add_request([plan.partition_key])],
        cursor=_cursor(plan),
    )
