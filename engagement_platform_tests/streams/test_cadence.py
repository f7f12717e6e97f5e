"""A stream's cadence (minimum batch size, maximum wait): the rule against its obvious reading, and the
sensor tick holding a small slice back until it is due, with the stream's lag on the topic observation."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from dagster import DagsterInstance, build_sensor_context
from hypothesis import given
from hypothesis import strategies as st

from engagement_platform.orchestration.kafka_stream import kafka_stream_tick
from engagement_platform.resources import KafkaResource, LakeResource
from engagement_platform.streams.cadence import Cadence, cadence_from, reached_bound
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import BatchPlan, KafkaSlice, uncommitted_records
from engagement_platform_tests.support.streams import clicks_stream

HIGH = {"offset": 0}  # the fake topic's high watermark, moved by the tests


class GrowingTopic(KafkaResource):
    """Kafka whose one partition holds HIGH["offset"] messages (no broker needed for the tick's logic)."""

    @property
    def client(self):
        return SimpleNamespace(watermarks=lambda topic: {0: (0, HIGH["offset"])})


@given(st.integers(1, 50), st.floats(0, 100), st.integers(0, 100), st.booleans(), st.none() | st.floats(0, 200))
def test_a_slice_is_due_when_big_enough_full_first_or_waited_long_enough(min_records, max_wait, records, full, waited):
    cadence = Cadence(min_records, max_wait)
    due = min_records == 1 or max_wait == 0 or full or records >= min_records or waited is None or waited >= max_wait
    reason = cadence.wait_reason(records, full, waited)
    assert (reason is None) == due
    if reason:
        assert f"batch minimum {min_records}" in reason


def test_cadence_settings_per_stream_override_the_defaults():
    env = {"EP_BATCH_MIN_RECORDS": "100", "EP_BATCH_MAX_WAIT_SECONDS": "30", "EP_INGESTION_BATCH_MAX_WAIT_SECONDS": "5"}
    assert cadence_from(env, "ingestion") == Cadence(100, 5.0)
    assert cadence_from(env, "mutation") == Cadence(100, 30.0)
    assert cadence_from({}, "mutation").plans_every_tick
    with pytest.raises(ValueError):
        cadence_from({"EP_BATCH_MIN_RECORDS": "0"}, "mutation")
    assert reached_bound([3, 10], 10) and not reached_bound([3, 9], 10)


def test_uncommitted_records_count_past_the_last_done_batch_or_the_start_of_one_in_flight():
    plan = BatchPlan("s", 2, KafkaSlice("t", (OffsetRange(0, 10, 20), OffsetRange(1, 5, 5))))
    marks = {0: (0, 25), 1: (0, 9), 2: (4, 6)}
    assert uncommitted_records(plan, True, marks) == 5 + 4 + 2
    assert uncommitted_records(plan, False, marks) == 15 + 4 + 2
    assert uncommitted_records(None, False, marks) == 25 + 9 + 2


def test_the_tick_holds_a_small_slice_back_until_it_is_big_enough_or_has_waited(tmp_path, monkeypatch):
    monkeypatch.setenv("EP_CLICKS_BATCH_MIN_RECORDS", "10")
    monkeypatch.setenv("EP_CLICKS_BATCH_MAX_WAIT_SECONDS", "3600")
    monkeypatch.setenv("EP_INGEST_MAX_RECORDS_PER_PARTITION", "1000")
    stream = clicks_stream()
    store = LakeResource(root=str(tmp_path / "lake")).checkpoints

    with DagsterInstance.ephemeral() as instance:

        def tick():
            with build_sensor_context(instance=instance) as ctx:
                return kafka_stream_tick(
                    ctx,
                    stream.definition,
                    stream.partitions,
                    GrowingTopic(bootstrap_servers="unused:9092"),
                    store,
                    None,
                )

        HIGH["offset"] = 3
        first = tick()  # never planned: due at once, however small
        assert first.run_requests and store.latest_plan("clicks").record_count == 3
        store.mark_done(store.latest_plan("clicks"))

        HIGH["offset"] = 8
        held = tick()
        assert (
            not held.run_requests and "5 new records, fewer than the batch minimum 10" in held.skip_reason.skip_message
        )
        assert held.asset_events[0].metadata["clicks_uncommitted_records"].value == 5
        assert store.latest_plan("clicks").batch_id == 1

        HIGH["offset"] = 13  # 10 waiting: due
        assert tick().run_requests and store.latest_plan("clicks").record_count == 10
        store.mark_done(store.latest_plan("clicks"))

        monkeypatch.setenv("EP_INGEST_MAX_RECORDS_PER_PARTITION", "2")  # a slice at the plan bound is always due
        HIGH["offset"] = 20
        assert tick().run_requests and store.latest_plan("clicks").record_count == 2
        store.mark_done(store.latest_plan("clicks"))

        monkeypatch.setenv("EP_INGEST_MAX_RECORDS_PER_PARTITION", "1000")
        monkeypatch.setenv("EP_CLICKS_BATCH_MAX_WAIT_SECONDS", "0.5")
        HIGH["offset"] = 16 + 1  # one record: waits until 0.5 s after the last plan
        planned = store.planned_at("clicks", 3)
        result = tick()
        if (
            not result.run_requests
        ):  # the tick may already be late on a loaded machine; if not, it is due after the wait
            assert "due in" in result.skip_reason.skip_message
            time.sleep(max(0.0, 0.6 - (time.time() - planned.timestamp())))
            result = tick()
        assert result.run_requests and store.latest_plan("clicks").record_count == 2
