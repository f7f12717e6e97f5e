"""A stream from a new package and one registry line (definitions_for, as definitions.py assembles the
platform's own): without servers, its Dagster parts and run-batch come from the registry and its batch
commits once however often it runs; against the real stack, the sensor plans the topic's records as one
batch, the job runs it, the table holds each record once, and a re-run of the batch appends nothing."""

import uuid

from dagster import AssetKey, DagsterInstance, SensorResult, build_sensor_context, materialize

from engagement_platform.definitions import definitions_for
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.registry import STREAMS, batch_run
from engagement_platform.resources import KafkaResource, LakeResource
from engagement_platform.streams.kafka import KafkaClient, Message, OffsetRange
from engagement_platform.streams.planning import BatchPlan, KafkaSlice
from engagement_platform.streams.spec import BatchContext
from engagement_platform_tests.support.streams import NoSpark
from engagement_platform_tests.toy_stream.stream import toy_stream


def fake_read_range(self, topic, ranges, timeout=60):
    """The records a slice holds, made up from their positions (no broker)."""
    for r in ranges:
        for offset in range(r.start, r.end):
            yield Message(r.partition, offset, f"k{r.partition}-{offset}".encode(), b"event", 0)


def test_a_stream_of_a_new_package_is_one_registry_line_and_its_batch_commits_once(tmp_path, monkeypatch):
    toy = toy_stream("demo.toy")
    defs = definitions_for([*STREAMS, toy])
    repo = defs.get_repository_def()
    assert {AssetKey("toy_events"), AssetKey(["kafka", "toy_events"]), AssetKey("engagement_activity")} <= set(
        repo.asset_graph.get_all_asset_keys()
    )
    assert repo.get_job("toy_events_job").tags["engagement/stream"] == "toy"
    assert "toy_events_sensor" in {s.name for s in repo.sensor_defs}

    monkeypatch.setattr(KafkaClient, "read_range", fake_read_range)
    root = str(tmp_path / "lake")
    lake = DeltaLake(root)
    checkpoints = CheckpointStore(lake)
    plan = BatchPlan("toy", 1, KafkaSlice("demo.toy", (OffsetRange(0, 0, 3), OffsetRange(1, 0, 2))))
    checkpoints.record_plan(plan)

    run = batch_run("toy", checkpoints, 1, entries=[*STREAMS, toy])  # run-batch finds it in the same list
    assert run(BatchContext(None, lake, checkpoints, "unused:9092")).versions["toy_events"] is not None
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("toy_events_batches", [plan.partition_key])
        out = materialize(
            [toy.parts().asset],  # its parts as registered, with fakes for Spark and Kafka
            partition_key=plan.partition_key,
            instance=instance,
            resources={
                "spark": NoSpark(),
                "lake": LakeResource(root=root),
                "kafka": KafkaResource(bootstrap_servers="unused:9092"),
            },
        )
    assert out.success
    (materialized,) = out.asset_materializations_for_node("toy_events")
    assert materialized.metadata["records_read"].value == 5
    assert materialized.metadata["toy_events_version"].value is None  # run-batch committed it already
    keys = lake.table("toy_events").to_pyarrow_table()["key"].to_pylist()
    assert sorted(keys) == ["k0-0", "k0-1", "k0-2", "k1-0", "k1-1"]


def test_a_stream_of_a_new_package_registered_with_one_line_runs_a_batch_through_dagster(
    stack, kafka, lake, checkpoints
):
    topic = f"test.toy.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({topic: 2})
    records = [(f"k{i}".encode(), f"event {i}".encode()) for i in range(7)]
    kafka.produce(topic, records)

    defs = definitions_for([*STREAMS, toy_stream(topic)])  # the registry plus one line
    repo = defs.get_repository_def()
    assert {AssetKey("toy_events"), AssetKey(["kafka", "toy_events"]), AssetKey("engagement_activity")} <= set(
        repo.asset_graph.get_all_asset_keys()
    )
    sensor, job = defs.get_sensor_def("toy_events_sensor"), defs.get_job_def("toy_events_job")

    with DagsterInstance.ephemeral() as instance:
        with build_sensor_context(instance=instance, resources=defs.resources) as context:
            tick = sensor(context)  # the Definitions' resources: the settings (the test stack and lake)
        assert isinstance(tick, SensorResult), tick
        (request,) = tick.run_requests
        plan = checkpoints.latest_plan("toy")
        assert plan.batch_id == 1 and plan.record_count == len(records)
        assert plan.slice_as(KafkaSlice).topic == topic
        for partitions in tick.dynamic_partitions_requests:
            instance.add_dynamic_partitions(partitions.partitions_def_name, list(partitions.partition_keys))

        first = job.execute_in_process(partition_key=request.partition_key, instance=instance, tags=request.tags)
        assert first.success
        (materialized,) = first.asset_materializations_for_node("toy_events")
        assert materialized.metadata["records_read"].value == len(records)
        assert checkpoints.latest("toy") == (plan, True)

        again = job.execute_in_process(partition_key=request.partition_key, instance=instance, tags=request.tags)
        assert again.success  # the batch's txn is in the table: nothing is appended twice

        with build_sensor_context(instance=instance, resources=defs.resources, cursor=tick.cursor) as context:
            idle = sensor(context)
        assert not idle.run_requests and "no new messages" in idle.skip_reason.skip_message

    rows = lake.table("toy_events").to_pyarrow_table()
    stored = sorted(zip(rows["key"].to_pylist(), rows["value"].to_pylist(), strict=True))
    assert stored == sorted((k.decode(), v.decode()) for k, v in records)
    assert set(rows["batch_id"].to_pylist()) == {1}
