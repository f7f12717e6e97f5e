"""`engagement-platform status` on the real stack, the ingestion stream driven into each state the runbook
names: nothing planned, records produced and not planned (lag), a batch planned and not run, a batch killed
after one table commit (committing) and re-run (done), its lock held by another owner, and paused after
MAX_ATTEMPTS failed runs (the sensor's own pause), then resumed as the runbook says. Each state is checked in
the command's JSON document and in a line of its table."""

from __future__ import annotations

import json
import os
import socket

import pytest
from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context, materialize

from engagement_platform import cli
from engagement_platform.engagement.ingestion.apply import STREAM
from engagement_platform.engagement.ingestion.assets import (
    engagement_ingestion,
    engagement_ingestion_sensor,
    ingestion_batches,
)
from engagement_platform.engagement.tables import ACTIVITY_LOCK, ENGAGEMENT_ACTIVITY
from engagement_platform.orchestration.runs import MAX_ATTEMPTS, STREAM_TAG
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource
from engagement_platform.settings import load_settings
from engagement_platform.streams.coordinator import Coordinator, run_liveness_info
from engagement_platform.streams.planning import plan_next_batch
from engagement_platform_tests.support.activities import produce_activities
from engagement_platform_tests.support.crash import finished, killed_at


@pytest.fixture
def dagster_home(tmp_path, monkeypatch) -> str:
    """A Dagster instance of the test's own, found by the command as a deployment's is (DAGSTER_HOME)."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return str(home)


def status_json(capsys, stream: str = STREAM) -> dict:
    """The command's JSON document (`status --json --stream ...`), the one stream's entry."""
    capsys.readouterr()
    cli.main(["status", "--json", "--stream", stream])
    (entry,) = json.loads(capsys.readouterr().out)["streams"]
    return entry


def status_text(capsys, stream: str = STREAM) -> str:
    capsys.readouterr()
    cli.main(["status", "--stream", stream])
    return capsys.readouterr().out


def row(text: str, stream: str = STREAM) -> list[str]:
    """The stream's row of the table, split on whitespace."""
    (cells,) = [line.split() for line in text.splitlines() if line.startswith(stream + " ")]
    return cells


def plan_batch(kafka, checkpoints, topic):
    """What the sensor does before it requests a run: the next slice, stored."""
    plan = plan_next_batch(STREAM, topic, checkpoints.latest_plan(STREAM), kafka.watermarks(topic), 10_000)
    assert checkpoints.record_plan(plan)
    return plan


def test_nothing_planned_then_records_produced_and_not_planned_are_its_lag(
    kafka, topic, lake_root, dagster_home, capsys
):
    entry = status_json(capsys)
    assert entry["batch"]["state"] == "none" and entry["batch"]["id"] is None
    assert entry["lag"] == {"records": 0, "unplanned": 0, "seconds": 0.0, "seconds_from": ""}
    assert entry["lock"]["name"] == ACTIVITY_LOCK and entry["lock"]["holder"] is None
    assert entry["attempts"]["failed"] == 0 and entry["paused"] is False
    assert row(status_text(capsys)) == ["ingestion", "-", "none", "0/3", "free", "0", "0", "no"]

    produce_activities(kafka, topic, 30)

    entry = status_json(capsys)
    assert entry["batch"]["state"] == "none"
    assert (entry["lag"]["records"], entry["lag"]["unplanned"]) == (30, 30)
    assert entry["lag"]["seconds"] >= 0 and entry["lag"]["seconds_from"] == "the oldest uncommitted record"
    assert row(status_text(capsys))[:6] == ["ingestion", "-", "none", "0/3", "free", "30"]


def test_a_planned_batch_that_has_not_run_is_planned_and_its_records_are_lag(
    kafka, topic, lake_root, checkpoints, dagster_home, capsys
):
    produce_activities(kafka, topic, 30)
    plan_batch(kafka, checkpoints, topic)

    entry = status_json(capsys)
    assert entry["batch"]["id"] == 1 and entry["batch"]["state"] == "planned"
    assert entry["batch"]["tables_committed"] == [] and entry["batch"]["records"] == 30
    assert entry["batch"]["partition"] == "00000001" and entry["batch"]["planned_at"]
    assert (entry["lag"]["records"], entry["lag"]["unplanned"]) == (30, 0), "planned, not committed"
    text = status_text(capsys)
    assert row(text)[:6] == ["ingestion", "1", "planned", "0/3", "free", "30"]
    assert any(line.startswith("ingestion: batch 1 planned at ") for line in text.splitlines())


def test_a_batch_killed_after_one_table_commit_is_committing_then_done_after_its_rerun(
    kafka, topic, lake_root, checkpoints, dagster_home, capsys
):
    produce_activities(kafka, topic, 25)
    plan_batch(kafka, checkpoints, topic)
    killed_at(STREAM, lake_root, 1, ENGAGEMENT_ACTIVITY.name)

    entry = status_json(capsys)
    assert entry["batch"]["state"] == "committing"
    assert entry["batch"]["tables_committed"] == [ENGAGEMENT_ACTIVITY.name]
    assert entry["lag"]["records"] == 25, "committed to one table is not committed"
    text = status_text(capsys)
    assert row(text)[:4] == ["ingestion", "1", "committing", f"({ENGAGEMENT_ACTIVITY.name})"]
    assert "ingestion: batch 1 planned at " in text and f"not done, already in {ENGAGEMENT_ACTIVITY.name}" in text

    finished(STREAM, lake_root, 1)

    entry = status_json(capsys)
    assert entry["batch"]["state"] == "done" and entry["batch"]["tables_committed"] == []
    assert (entry["lag"]["records"], entry["lag"]["unplanned"], entry["lag"]["seconds"]) == (0, 0, 0.0)
    assert row(status_text(capsys)) == ["ingestion", "1", "done", "0/3", "free", "0", "0", "no"]


def test_a_lock_held_by_another_owner_names_the_owner_its_host_its_run_and_the_last_job(
    stack, lake_root, dagster_home, capsys
):
    settings = load_settings()
    zk = Coordinator(settings.zookeeper_hosts, settings.zookeeper_root, auth=settings.zookeeper_auth)
    try:
        lease = zk.lock(ACTIVITY_LOCK, "mutation/7", timeout_s=10)
        zk.register(lease, "mutation", frozenset())
        assert zk.register_run("run-of-mutation-7", run_liveness_info("run-of-mutation-7", {"stream": "mutation"}))

        entry = status_json(capsys)
        assert entry["lock"]["name"] == ACTIVITY_LOCK and entry["lock"]["holder"] == "mutation/7"
        assert (entry["lock"]["host"], entry["lock"]["pid"]) == (socket.gethostname(), os.getpid())
        assert entry["lock"]["run_id"] == "run-of-mutation-7"
        assert entry["lock"]["last_registered"].startswith("mutation (mutation/7, at ")
        assert status_json(capsys, "retention")["lock"]["holder"] == "mutation/7", "the streams share the lock"
        text = status_text(capsys)
        assert row(text)[4:7] == ["held", "by", "mutation/7"]
        assert (
            f"lock {ACTIVITY_LOCK} held by mutation/7 (host {socket.gethostname()}, pid {os.getpid()}, "
            f"run run-of-mutation-7); taken by ingestion"
        ) in text

        zk.unlock(lease)
        entry = status_json(capsys)
        assert entry["lock"]["holder"] is None and entry["lock"]["last_registered"].startswith("mutation")
    finally:
        zk.close()


def test_a_batch_whose_code_failed_max_attempts_times_is_paused_and_resumes_as_the_runbook_says(
    stack, kafka, topic, lake_root, checkpoints, dagster_home, tmp_path, capsys
):
    """The pause is the sensor's: runs of the batch whose own code failed, MAX_ATTEMPTS of them. The command says
    so (and how to resume) where the sensor's tick skips saying "paused"; running the batch by hand, as its
    resume line says, ends the pause."""
    resources = {
        "kafka": KafkaResource(bootstrap_servers=stack["KAFKA_BOOTSTRAP_SERVERS"]),
        "lake": LakeResource(root=lake_root),
        "coordinator": CoordinatorResource(lake=LakeResource(root=lake_root)),
    }
    no_lake = LakeResource(root=str(tmp_path / "no-such-lake"))
    broken = {**resources, "lake": no_lake, "spark": SparkResource(), "coordinator": CoordinatorResource(lake=no_lake)}
    produce_activities(kafka, topic, 20)

    with DagsterInstance.get() as instance:

        def tick():
            with build_sensor_context(instance=instance, resources=resources) as context:
                return engagement_ingestion_sensor(context)

        first = tick()
        assert isinstance(first, SensorResult) and first.run_requests, "the sensor planned batch 1"
        instance.add_dynamic_partitions(ingestion_batches.name, ["00000001"])
        for attempt in range(1, MAX_ATTEMPTS + 1):
            failed = materialize(
                [engagement_ingestion],
                partition_key="00000001",
                instance=instance,
                resources=broken,
                tags={STREAM_TAG: STREAM},
                raise_on_error=False,
            )
            assert not failed.success
            entry = status_json(capsys)
            assert entry["attempts"]["failed"] == attempt and entry["attempts"]["max_attempts"] == MAX_ATTEMPTS
            assert entry["paused"] is (attempt == MAX_ATTEMPTS)
            skipped = tick()
            assert isinstance(skipped, SkipReason) == (attempt == MAX_ATTEMPTS), "the sensor pauses it too"

        assert "paused" in skipped.skip_message
        assert entry["batch"]["state"] == "planned"
        assert entry["attempts"]["last_failed_run"] == failed.run_id
        resume = entry["resume"]
        assert f"Runs > {failed.run_id} > Re-execute > All steps (partition 00000001)" in resume
        assert "`engagement-platform run-batch --stream ingestion --batch-id 1`" in resume
        text = status_text(capsys)
        assert row(text)[-1] == "PAUSED" and row(text)[3] == f"{MAX_ATTEMPTS}/{MAX_ATTEMPTS}"
        assert f"ingestion: PAUSED after {MAX_ATTEMPTS} failed attempts. Resume: " in text

        finished(STREAM, lake_root, 1)  # the resume line's way outside Dagster

        entry = status_json(capsys)
        assert entry["batch"]["state"] == "done" and entry["paused"] is False and entry["resume"] is None
        after = tick()
        message = after.skip_reason.skip_message if isinstance(after, SensorResult) else after.skip_message
        assert "no new messages" in message, "the sensor moved past the batch"
