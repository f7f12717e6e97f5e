import json

import pytest
from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context, materialize

from engagement_platform.engagement.ingestion.apply import STREAM
from engagement_platform.engagement.ingestion.assets import (
    engagement_ingestion,
    engagement_ingestion_sensor,
    ingestion_batches,
)
from engagement_platform.orchestration.runs import MAX_ATTEMPTS, STREAM_TAG
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource
from engagement_platform_tests.support.activities import produce_activities


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


@pytest.fixture
def resources(stack, lake_root):
    return {
        "kafka": KafkaResource(bootstrap_servers=stack["KAFKA_BOOTSTRAP_SERVERS"]),
        "lake": LakeResource(root=lake_root),
        "coordinator": CoordinatorResource(lake=LakeResource(root=lake_root)),
    }


def tick(instance, resources, cursor=None):
    with build_sensor_context(instance=instance, resources=resources, cursor=cursor) as ctx:
        return engagement_ingestion_sensor(ctx)


def test_first_tick_plans_a_bounded_batch_and_requests_its_run(
    kafka, topic, instance, resources, checkpoints, monkeypatch
):
    monkeypatch.setenv("EP_INGEST_MAX_RECORDS_PER_PARTITION", "30")
    produce_activities(kafka, topic, 120)
    marks = kafka.watermarks(topic)

    result = tick(instance, resources)

    assert isinstance(result, SensorResult)
    (request,) = result.run_requests
    plan = checkpoints.latest_plan(STREAM)
    assert plan.batch_id == 1 and request.partition_key == "00000001"
    assert request.run_key == plan.run_key and topic in request.run_key
    assert request.tags[STREAM_TAG] == STREAM
    assert all(r.start == 0 and r.end == min(30, marks[r.partition][1]) for r in plan.ranges)
    assert result.dynamic_partitions_requests[0].partition_keys == ["00000001"]
    assert json.loads(result.cursor) == {"batch_id": 1, "next_offsets": {str(r.partition): r.end for r in plan.ranges}}
    (observation,) = result.asset_events
    assert observation.metadata["messages_total"].value == 120


def skipped(result) -> str | None:
    if isinstance(result, SkipReason):
        return result.skip_message
    return result.skip_reason.skip_message if isinstance(result, SensorResult) and result.skip_reason else None


def test_no_new_messages_is_a_skip_with_a_reason_and_the_topic_is_observed(kafka, topic, instance, resources):
    result = tick(instance, resources)
    assert "no new messages" in skipped(result)
    (observation,) = result.asset_events
    assert observation.asset_key.to_user_string() == "kafka/engagement_activities"
    assert observation.metadata["messages_total"].value == 0


def test_unfinished_batch_is_requested_again_with_the_same_key_then_next_batch_after_done(
    spark, kafka, topic, instance, resources, lake_root, checkpoints, stack
):
    produce_activities(kafka, topic, 60)
    first = tick(instance, resources)
    again = tick(instance, resources, first.cursor)
    assert again.run_requests[0].run_key == first.run_requests[0].run_key, (
        "no run happened: same request, deduped by key"
    )

    instance.add_dynamic_partitions(ingestion_batches.name, ["00000001"])
    out = materialize(
        [engagement_ingestion],
        partition_key="00000001",
        instance=instance,
        tags={STREAM_TAG: STREAM},
        resources={**resources, "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]})},
    )
    assert out.success
    assert "no new messages" in skipped(tick(instance, resources, again.cursor))

    produce_activities(kafka, topic, 10, seed=2, id_prefix="f")
    nxt = tick(instance, resources, again.cursor)
    plan2 = checkpoints.plan(STREAM, 2)
    assert nxt.run_requests[0].partition_key == "00000002"
    assert {r.partition: r.start for r in plan2.ranges} == checkpoints.plan(STREAM, 1).ends()


def test_failed_batch_is_retried_with_a_new_key_then_the_stream_pauses(kafka, topic, instance, resources, tmp_path):
    produce_activities(kafka, topic, 20)
    first = tick(instance, resources)
    key = first.run_requests[0].partition_key
    instance.add_dynamic_partitions(ingestion_batches.name, [key])
    no_lake = LakeResource(root=str(tmp_path / "no-such-lake"))
    broken = {
        "lake": no_lake,
        "kafka": resources["kafka"],
        "spark": SparkResource(),
        "coordinator": CoordinatorResource(lake=no_lake),
    }
    keys = [first.run_requests[0].run_key]
    for attempt in range(1, MAX_ATTEMPTS + 1):
        failed = materialize(
            [engagement_ingestion],
            partition_key=key,
            instance=instance,
            resources=broken,
            tags={STREAM_TAG: STREAM},
            raise_on_error=False,
        )
        assert not failed.success
        result = tick(instance, resources)
        if attempt < MAX_ATTEMPTS:
            keys.append(result.run_requests[0].run_key)
            assert result.run_requests[0].partition_key == key
    assert keys == [keys[0]] + [f"{keys[0]}#attempt{n}" for n in range(2, MAX_ATTEMPTS + 1)]
    assert isinstance(result, SkipReason) and "paused" in result.skip_message
