"""Sensors of the Kafka-fed streams (ingestion, mutation, retention): plan the next slice and request its run.

One batch in flight at a time, retried with the same plan after a failure (batch_dagster.py).
"""


import json
from collections.abc import Callable

from dagster import AssetKey, DefaultSensorStatus, DynamicPartitionsDefinition, SensorEvaluationContext, SensorResult, SkipReason, sensor

from engagement_platform.orchestration.runs import resume_unfinished, run_request
from engagement_platform.engagement.mutation import apply as mutations
from engagement_platform.engagement.retention import apply as retention
from engagement_platform.engagement.assets import GDPR_TOPIC_ASSET, MUTATIONS_TOPIC_ASSET, TOPIC_ASSET, topic_observation
from engagement_platform.engagement.ingestion.apply import STREAM
from engagement_platform.engagement.mutation.tables import ENGAGEMENT_MUTATIONS_PENDING
from engagement_platform.engagement.jobs import ingestion_job, mutation_job, retention_job
from engagement_platform.engagement.partitions import ingestion_batches, mutation_batches, retention_batches
from engagement_platform.resources import CoordinatorResource, KafkaResource
from engagement_platform.settings import load_settings
import pyarrow.compute as pc

from engagement_platform.lake.checkpoints import BATCH, PLAN, CheckpointStore
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import BatchPlan, plan_next_batch

RETRY_TAG = "engagement/pending_retry_after_ingestion_batch"  # on mutation runs planned only to retry pending requests


def _tags(plan: BatchPlan) -> dict[str, str]:
    return {"engagement/records": str(plan.record_count)}


def _cursor(plan: BatchPlan, extra: dict | None = None) -> str:
    return json.dumps({"batch_id": plan.batch_id, "next_offsets": {str(p): e for p, e in plan.ends().items()}, **(extra or {})})


# An idle tick's fallback: (plan, extra run tags, run key suffix), or None to skip.
IdlePlan = Callable[[BatchPlan | None, dict[int, tuple[int, int]]], "tuple[BatchPlan, dict[str, str], str] | None"]


def kafka_stream_tick(context: SensorEvaluationContext, kafka: KafkaResource, coordinator: CoordinatorResource, stream: str, topic: str,
                      partitions: DynamicPartitionsDefinition, topic_key: AssetKey, idle_plan: IdlePlan | None = None,
                      cursor_extra: dict | None = None):
    """One tick of a Kafka-fed stream: resume the unfinished batch, or plan the next slice (or, with no new
    messages, what `idle_plan` asks for: the mutation stream's retry of pending requests)."""
    store = coordinator.checkpoints
    latest, done = store.latest(stream)
    if latest is not None and not done:
        return resume_unfinished(context, latest, partitions, _tags, _cursor(latest),
                                 lambda plan: coordinator.predecessor_wait(plan.stream, plan.batch_id))
    watermarks = kafka.client.watermarks(topic)
    plan = plan_next_batch(stream, topic, latest, watermarks, load_settings().max_records_per_partition)
    observed = [topic_observation(watermarks, topic_key)]
    tags, run_key_suffix = {}, ""
    if plan is None and idle_plan is not None:
        plan, tags, run_key_suffix = idle_plan(latest, watermarks) or (None, {}, "")
    if plan is None:
        return SensorResult(
            skip_reason=f"no new messages on {topic} (high watermarks {dict(sorted((p, h) for p, (_, h) in watermarks.items()))})",
            asset_events=observed,
        )
    store.record_plan(plan)
    request = run_request(plan, 1, {**_tags(plan), **tags})
    return SensorResult(
        run_requests=[request.with_replaced_attrs(run_key=request.run_key + run_key_suffix) if run_key_suffix else request],
        asset_events=observed,
        dynamic_partitions_requests=[partitions.build_add_request([plan.partition_key])],
        cursor=_cursor(plan, cursor_extra),
    )


def ingestion_done_after_plan(store: CheckpointStore, plan: BatchPlan | None) -> int | None:
    """Id of the latest ingestion batch whose `done` was recorded after `plan` was (None: none since)."""
    if plan is None:
        return None
    mine = store.rows(plan.stream)
    mine = mine.filter(pc.and_(pc.equal(mine["batch_id"], plan.batch_id), pc.equal(mine["process"], PLAN)))
    rows = store.rows(STREAM)
    rows = rows.filter(pc.and_(pc.equal(rows["process"], BATCH), pc.equal(rows["state"], "done")))
    if mine.num_rows == 0 or rows.num_rows == 0:
        return None
    after = rows.filter(pc.greater(rows["recorded_at"], pc.min(mine["recorded_at"])))
    return pc.max(after["batch_id"]).as_py() if after.num_rows else None


def pending_retry_plan(store: CheckpointStore) -> IdlePlan:
    """With no new requests: an empty slice (the same next offsets) when engagement_mutations_pending is not
    empty and an ingestion batch finished after the last mutation batch was planned, so the batch
    re-evaluates the pending requests against the new rows. The run key names that ingestion batch."""
    def plan(latest: BatchPlan | None, watermarks: dict[int, tuple[int, int]]):
        ingested = ingestion_done_after_plan(store, latest)
        if ingested is None:
            return None
        lake = store.lake
        if not lake.exists(ENGAGEMENT_MUTATIONS_PENDING.name) or lake.table(ENGAGEMENT_MUTATIONS_PENDING.name).to_pyarrow_dataset().count_rows() == 0:
            return None
        ends = latest.ends()
        ranges = tuple(OffsetRange(p, max(ends.get(p, low), low), max(ends.get(p, low), low)) for p, (low, _) in sorted(watermarks.items()))
        retry = BatchPlan(latest.stream, latest.batch_id + 1, latest.topic, ranges)
        return retry, {RETRY_TAG: str(ingested)}, f"/retry-after-ingestion-{ingested}"
    return plan


@sensor(job=ingestion_job, minimum_interval_seconds=5, default_status=DefaultSensorStatus.RUNNING)
def engagement_ingestion_sensor(context: SensorEvaluationContext, kafka: KafkaResource, coordinator: CoordinatorResource):
    """Plans the next offset slice of engagement.activities when the previous batch is done."""
    return kafka_stream_tick(context, kafka, coordinator, STREAM, load_settings().ingestion.topic, ingestion_batches, TOPIC_ASSET)


@sensor(job=mutation_job, minimum_interval_seconds=5, default_status=DefaultSensorStatus.RUNNING)
def engagement_mutation_sensor(context: SensorEvaluationContext, kafka: KafkaResource, coordinator: CoordinatorResource):
    """Plans the next slice of engagement.mutations when the previous mutation batch is done.

    Pending requests are retried with every batch, and on their own (an empty slice) when ingestion has
    finished batches since the last mutation batch and the pending table is not empty."""
    return kafka_stream_tick(context, kafka, coordinator, mutations.STREAM, mutations.mutations_topic(), mutation_batches, MUTATIONS_TOPIC_ASSET,
                             idle_plan=pending_retry_plan(coordinator.checkpoints))


@sensor(job=retention_job, minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING)
def engagement_retention_sensor(context: SensorEvaluationContext, kafka: KafkaResource, coordinator: CoordinatorResource):
    """Plans the next slice of engagement.gdpr (retention and erasure requests) once per
    EP_RETENTION_INTERVAL_SECONDS (default daily, read at run time) after the previous batch was planned."""
    interval = retention.interval_seconds()
    wait = retention.seconds_until_due(coordinator.checkpoints, interval)
    if wait > 0:
        return SkipReason(f"next retention batch due in {wait:.0f}s (cadence {interval}s, EP_RETENTION_INTERVAL_SECONDS)")
    return kafka_stream_tick(context, kafka, coordinator, retention.STREAM, retention.gdpr_topic(), retention_batches, GDPR_TOPIC_ASSET)
