"""The Kafka stream factory without servers: a fourth stream is one call (asset, job, sensor, common
checks, loadable Definitions), its run goes plan -> run_batch -> table reports -> checks, the sensor's
gates skip with a reason before Kafka is read, a batch whose run would wait its turn is not requested, and an
idle tick reads no table and reports only what changed."""

import json
from types import SimpleNamespace

from dagster import AssetKey, DagsterInstance, Definitions, SkipReason, build_sensor_context, materialize

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.orchestration.checks import (
    NOTIFICATIONS_MATCH_CHANGES,
    OFFSET_RANGES_CONTIGUOUS,
    RECORDS_CONSERVED,
    conservation,
)
from engagement_platform.orchestration.kafka_stream import kafka_stream_tick
from engagement_platform.orchestration.parts import combine
from engagement_platform.orchestration.reported import REPORTED
from engagement_platform.orchestration.runs import STREAM_TAG, cursor_ahead_of_store
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import BatchPlan, KafkaSlice
from engagement_platform_tests.support.streams import FiveMessages, NoSpark, clicks_stream, count_clicks


def test_a_fourth_stream_is_one_call_with_its_asset_job_sensor_and_common_checks(tmp_path):
    stream = clicks_stream()
    lake = LakeResource(root=str(tmp_path / "lake"))
    defs = Definitions(
        **combine(stream),
        resources={
            "lake": lake,
            "kafka": KafkaResource(bootstrap_servers="unused:9092"),
            "coordinator": CoordinatorResource(lake=lake),
            "spark": SparkResource(),
        },
    )
    Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()

    assert {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()} == {"kafka/demo_clicks", "demo_clicks"}
    assert AssetKey(["kafka", "demo_clicks"]) in repo.asset_graph.get(AssetKey("demo_clicks")).parent_keys
    checks = {(c.asset_key.to_user_string(), c.name) for c in repo.asset_graph.asset_check_keys}
    assert checks == {
        ("demo_clicks", n) for n in (OFFSET_RANGES_CONTIGUOUS, RECORDS_CONSERVED, NOTIFICATIONS_MATCH_CHANGES)
    }
    assert not any(spec.blocking for spec in stream.asset.check_specs), "audits of a committed batch block nothing"

    assert stream.partitions.name == "demo_clicks_batches" and stream.asset.partitions_def == stream.partitions
    job = repo.get_job("demo_clicks_job")
    assert job.tags[STREAM_TAG] == "clicks"
    (sensor,) = repo.sensor_defs
    assert sensor.name == "demo_clicks_sensor" and sensor.job_name == "demo_clicks_job"
    # A stream without a lock needs no coordinator: only the checkpoint store in the lake.
    assert sensor.required_resource_keys == {"kafka", "lake"}
    assert stream.asset.required_resource_keys - {"io_manager"} == {"spark", "lake", "kafka"}


def test_its_run_commits_the_planned_batch_reports_each_table_and_evaluates_the_checks(tmp_path):
    stream = clicks_stream(run_batch=count_clicks)
    root = str(tmp_path / "lake")
    plan = BatchPlan("clicks", 1, KafkaSlice("demo.clicks", (OffsetRange(0, 0, 5), OffsetRange(1, 0, 3))))
    CheckpointStore(DeltaLake(root)).record_plan(plan)
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(stream.partitions.name, [plan.partition_key])
        out = materialize(
            [stream.asset],
            partition_key=plan.partition_key,
            instance=instance,
            resources={
                "spark": NoSpark(),
                "lake": LakeResource(root=root),
                "kafka": KafkaResource(bootstrap_servers="unused:9092"),
            },
        )
    assert out.success
    reported = {m.asset_key.to_user_string(): m.metadata for m in out.asset_materializations_for_node("demo_clicks")}
    assert reported["demo_clicks"]["records_read"].value == 8
    assert (
        reported["demo_clicks_table"]["table_version"].value == "already committed"
        and reported["demo_clicks_table"]["stream"].value == "clicks"
    )
    checks = {c.check_name: c for c in out.get_asset_check_evaluations()}
    assert set(checks) == {OFFSET_RANGES_CONTIGUOUS, RECORDS_CONSERVED, NOTIFICATIONS_MATCH_CHANGES}
    assert all(c.passed for c in checks.values()), {n: c.metadata for n, c in checks.items()}
    assert checks[OFFSET_RANGES_CONTIGUOUS].metadata["gap_offsets"].value == 0
    # demo_clicks_table does not exist here: no commit to find, and no notification rows either.
    assert checks[NOTIFICATIONS_MATCH_CHANGES].metadata["rows_notified"].value == 0


def test_a_stream_with_a_lock_runs_and_senses_through_the_coordinator():
    stream = clicks_stream(lock_name="demo_clicks_table", sensor_name="clicks_planner", partitions_name="clicks_slices")
    assert stream.sensor.name == "clicks_planner" and stream.partitions.name == "clicks_slices"
    assert stream.sensor.required_resource_keys == {"kafka", "coordinator"}
    assert stream.asset.required_resource_keys - {"io_manager"} == {"spark", "lake", "kafka", "coordinator"}


def test_a_cursor_ahead_of_the_checkpoint_store_skips_with_a_reason_before_kafka_is_read(tmp_path):
    stream = clicks_stream()
    resources = {
        "lake": LakeResource(root=str(tmp_path / "empty-lake")),
        "kafka": KafkaResource(bootstrap_servers="unused:9092"),
    }
    with build_sensor_context(
        resources=resources, cursor=json.dumps({"batch_id": 7, "next_offsets": {"0": 70}})
    ) as ctx:
        result = stream.sensor(ctx)
    assert isinstance(result, SkipReason)
    assert "batch 7" in result.skip_message and "reset this sensor's cursor" in result.skip_message.lower()


def test_the_tick_gate_skips_before_anything_is_read(tmp_path):
    stream = clicks_stream(tick_gate=lambda store: "not due for 60s")
    resources = {
        "lake": LakeResource(root=str(tmp_path / "lake")),
        "kafka": KafkaResource(bootstrap_servers="unused:9092"),
    }
    with build_sensor_context(resources=resources) as ctx:
        result = stream.sensor(ctx)
    assert isinstance(result, SkipReason) and result.skip_message == "not due for 60s"


def test_cursor_ahead_of_store_only_for_a_batch_the_store_never_planned():
    plan = BatchPlan("clicks", 3, KafkaSlice("demo.clicks", (OffsetRange(0, 20, 30),)))
    assert cursor_ahead_of_store(None, "clicks", plan) is None
    assert cursor_ahead_of_store(json.dumps({"batch_id": 3}), "clicks", plan) is None
    assert (
        cursor_ahead_of_store(json.dumps({"batch_id": 2}), "clicks", plan) is None
    )  # the store moved on (a lost cursor write)
    assert "batch 4" in cursor_ahead_of_store(json.dumps({"batch_id": 4}), "clicks", plan)
    assert "none" in cursor_ahead_of_store(json.dumps({"batch_id": 1}), "clicks", None)


def test_conservation_warns_on_unread_offsets_and_fails_on_unaccounted_records():
    ok = conservation("c", ("records_read", 10), {"rows": 7, "quarantined": 3}, planned=10)
    assert ok.passed and ok.metadata["unaccounted"].value == 0 and ok.metadata["planned_but_unread"].value == 0
    unread = conservation("c", ("records_read", 9), {"rows": 9}, planned=10)
    assert not unread.passed and unread.severity.value == "WARN"
    assert conservation("c", ("records_read", 9), {"rows": 9}, planned=10, unread_warns=False).severity.value == "ERROR"
    lost = conservation("c", ("records_read", 10), {"rows": 8}, planned=10)
    assert not lost.passed and lost.severity.value == "ERROR" and lost.metadata["unaccounted"].value == 2


def test_a_batch_whose_run_would_wait_its_turn_is_neither_planned_nor_re_requested(tmp_path):
    """The tick asks `turn_wait` before a new batch's run (nothing is recorded while it says wait) and
    before re-requesting a planned batch; only after a coordination give-up does it ask about the
    predecessor rule as well (after_give_up=True)."""
    stream = clicks_stream(lock_name="demo_clicks_table")
    store = LakeResource(root=str(tmp_path / "lake")).checkpoints
    asked: list[tuple[int, bool]] = []
    answer = {"reason": "lock demo_clicks_table held by backfill/1"}

    def turn_wait(plan, after_give_up):
        asked.append((plan.batch_id, after_give_up))
        return answer["reason"]

    with DagsterInstance.ephemeral() as instance:

        def tick():
            with build_sensor_context(instance=instance) as ctx:
                return kafka_stream_tick(
                    ctx,
                    stream.definition,
                    stream.partitions,
                    FiveMessages(bootstrap_servers="unused:9092"),
                    store,
                    turn_wait,
                )

        held = tick()
        assert (
            not held.run_requests
            and held.skip_reason.skip_message
            == "clicks batch 1 waits for its turn: lock demo_clicks_table held by backfill/1"
        )
        assert "batch_id" not in json.loads(held.cursor) and store.latest_plan("clicks") is None
        assert held.asset_events, "the topic is still observed"

        answer["reason"] = None
        first = tick()
        assert first.run_requests[0].partition_key == "00000001" and store.latest_plan("clicks").batch_id == 1

        answer["reason"] = "lock demo_clicks_table held by backfill/2"
        again = tick()  # planned, no run yet: the re-request waits too
        assert (
            isinstance(again, SkipReason)
            and again.skip_message == "clicks batch 1 waits for its turn: lock demo_clicks_table held by backfill/2"
        )
        assert asked == [
            (1, True),
            (1, True),
            (1, False),
        ]  # a new batch: the lock and the predecessor rule; a re-request: the lock


class Marks(KafkaResource):
    """Kafka whose one partition has the (low, high) watermarks in MARKS (no broker needed)."""

    @property
    def client(self):
        return SimpleNamespace(watermarks=lambda topic: {0: MARKS["now"]})


MARKS = {"now": (0, 5)}


def test_an_idle_tick_reads_no_table_and_reports_only_what_changed(tmp_path, monkeypatch):
    """Nothing new on the topic, the last batch done: the first tick reports the topic (and records that in its
    cursor), the next ones report nothing and leave the cursor as it is, without reading the checkpoint table; a
    figure that changed (the topic's retention moved the low watermark) is reported once."""
    stream = clicks_stream()
    store = LakeResource(root=str(tmp_path / "lake")).checkpoints
    plan = BatchPlan("clicks", 1, KafkaSlice("demo.clicks", (OffsetRange(0, 0, 5),)))
    store.record_plan(plan)
    store.mark_done(plan)
    reads = []
    read = DeltaLake.read
    monkeypatch.setattr(DeltaLake, "read", lambda self, *a, **k: reads.append(a) or read(self, *a, **k))
    MARKS["now"] = (0, 5)

    with DagsterInstance.ephemeral() as instance:

        def tick(cursor):
            with build_sensor_context(instance=instance, cursor=cursor) as ctx:
                return kafka_stream_tick(ctx, stream.definition, stream.partitions, Marks(), store, None)

        first = tick(None)
        assert "no new messages" in first.skip_reason.skip_message and len(first.asset_events) == 1
        assert json.loads(first.cursor)[REPORTED]
        read_by_first = len(reads)
        second = tick(first.cursor)
        assert "no new messages" in second.skip_reason.skip_message
        assert second.asset_events == [] and second.cursor is None, "nothing written: no event, the cursor stays"
        assert len(reads) == read_by_first, "the checkpoint table did not move: not read again"

        MARKS["now"] = (2, 5)
        moved = tick(first.cursor)
        assert [e.metadata["partition_0_low"].value for e in moved.asset_events] == [2] and moved.cursor
        assert tick(moved.cursor).asset_events == []
