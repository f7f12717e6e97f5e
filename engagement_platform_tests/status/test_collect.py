"""`engagement-platform status` without the stack's servers: a local lake, a broker and a ZooKeeper that do not
answer (their columns say "unavailable", the command still reports what the lake says), the state of a batch
from the tables' txn versions, and the pause counted from an instance's runs as the sensors count them."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from dagster import DagsterInstance, DynamicPartitionsDefinition, asset, materialize

from engagement_platform import cli
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec
from engagement_platform.orchestration.runs import COORDINATION_TAG, MAX_ATTEMPTS, STREAM_TAG
from engagement_platform.settings import load_settings
from engagement_platform.status import kafka_lag, locks
from engagement_platform.status.collect import collect
from engagement_platform.status.lake import LakeReads
from engagement_platform.status.report import COORDINATOR_OFF, UNAVAILABLE, Attempts
from engagement_platform.status.streams import platform_streams, selected
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import BatchPlan, KafkaSlice

CLOSED = "127.0.0.1:1"  # nothing listens: connections are refused
INGESTION_APP_ID = "engagement.ingestion"
SCRATCH = TableSpec("scratch", pa.schema([("n", pa.int64())]), change_data_feed=False)


@pytest.fixture
def lake(tmp_path, monkeypatch) -> DeltaLake:
    """A local lake in a deployment whose broker and ZooKeeper do not answer and whose Dagster home is unknown."""
    monkeypatch.setenv("EP_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("EP_LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", CLOSED)
    monkeypatch.setenv("ZOOKEEPER_HOSTS", CLOSED)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setattr(kafka_lag, "KAFKA_TIMEOUT_S", 0.5)
    monkeypatch.setattr(locks, "ZOOKEEPER_TIMEOUT_S", 0.5)
    return DeltaLake(str(tmp_path / "lake"))


def plan(batch_id: int, start: int = 0) -> BatchPlan:
    ranges = (OffsetRange(0, start, start + 5), OffsetRange(1, start, start + 3))
    return BatchPlan("ingestion", batch_id, KafkaSlice("engagement.activities", ranges))


def commit_scratch(lake: DeltaLake, batch_id: int) -> int | None:
    """A table commit of the ingestion stream's batch (its txn app id and version), as a killed run leaves it."""
    return lake.append(SCRATCH, pa.table({"n": [batch_id]}), BatchTxn(INGESTION_APP_ID, batch_id))


def ingestion(report):
    (status,) = [s for s in report.streams if s.stream == "ingestion"]
    return status


def test_services_that_do_not_answer_make_their_columns_unavailable(lake, capsys):
    CheckpointStore(lake).record_plan(plan(1))

    report = collect(wanted="ingestion")

    status = ingestion(report)
    assert (status.batch.batch_id, status.batch.state, status.batch.records) == (1, "planned", 8)
    assert status.lock == UNAVAILABLE and status.attempts == UNAVAILABLE and status.paused == UNAVAILABLE
    assert status.lag.records == UNAVAILABLE and status.lag.unplanned == UNAVAILABLE
    assert isinstance(status.lag.seconds, float) and status.lag.seconds_from.startswith("batch 1 planned at")
    assert {s.name: s.available for s in report.services} == {
        "lake": True,
        "kafka": False,
        "zookeeper": False,
        "dagster": False,
    }

    cli.main(["status", "--stream", "ingestion"])
    text = capsys.readouterr().out
    (row,) = [line.split() for line in text.splitlines() if line.startswith("ingestion ")]
    assert row[:3] == ["ingestion", "1", "planned"] and row[3:6] == [UNAVAILABLE] * 3
    assert "services: lake ok" in text and "kafka unavailable" in text and "zookeeper unavailable" in text

    cli.main(["status", "--json", "--stream", "ingestion"])
    (document,) = [json.loads(capsys.readouterr().out)]
    (only,) = document["streams"]
    assert only["batch"]["state"] == "planned" and only["lock"] == UNAVAILABLE and only["paused"] == UNAVAILABLE


def test_a_batch_is_committing_once_a_table_holds_its_txn_and_done_after_its_outcome_rows(lake):
    checkpoints = CheckpointStore(lake)
    first = plan(1)
    checkpoints.record_plan(first)
    version = commit_scratch(lake, 1)
    # before the stream's first outcome rows, every table of the lake is asked
    assert ingestion(collect(wanted="ingestion")).batch.tables_committed == ("scratch",)
    assert ingestion(collect(wanted="ingestion")).batch.state == "committing"

    checkpoints.finish_batches([(first, {"scratch": version})])
    assert ingestion(collect(wanted="ingestion")).batch.state == "done"

    second = plan(2, start=5)
    checkpoints.record_plan(second)
    assert ingestion(collect(wanted="ingestion")).batch.state == "planned"
    commit_scratch(lake, 2)  # asked now because batch 1's outcome rows name it
    batch = ingestion(collect(wanted="ingestion")).batch
    assert (batch.batch_id, batch.state, batch.tables_committed) == (2, "committing", ("scratch",))


def test_the_pause_is_counted_from_the_runs_as_the_sensor_counts_them(lake):
    """Runs whose own code failed count (MAX_ATTEMPTS of them pause the stream); a coordination give-up does not."""
    CheckpointStore(lake).record_plan(plan(1))
    batches = DynamicPartitionsDefinition(name="status_test_batches")

    @asset(partitions_def=batches)
    def broken_batch() -> None:
        raise RuntimeError("the batch's own code fails")

    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(batches.name, ["00000001"])

        def fail(**tags: str) -> None:
            run = materialize(
                [broken_batch],
                partition_key="00000001",
                instance=instance,
                tags={STREAM_TAG: "ingestion", **tags},
                raise_on_error=False,
            )
            assert not run.success

        fail(**{COORDINATION_TAG: "gave_up"})
        for _ in range(MAX_ATTEMPTS - 1):
            fail()
        attempts = ingestion(collect(wanted="ingestion", instance=instance)).attempts
        assert isinstance(attempts, Attempts)
        assert (attempts.failed, attempts.gave_up, attempts.paused) == (MAX_ATTEMPTS - 1, 1, False)

        fail()
        status = ingestion(collect(wanted="ingestion", instance=instance))
        assert isinstance(status.attempts, Attempts)
        assert (status.attempts.failed, status.paused) == (MAX_ATTEMPTS, True)
        assert status.resume is not None and f"Runs > {status.attempts.last_failed_run} > Re-execute" in status.resume
        assert "(partition 00000001)" in status.resume and "--batch-id 1" in status.resume


def test_the_streams_are_the_registry_s_with_the_tenants_and_pipelines_the_lake_names(lake):
    planned = {"ingestion", "profile_processor/tenant01", "profile_segments/tenant01", "an_old_stream"}
    refs = platform_streams(load_settings(), planned, tenants={"tenant02"})
    names = [r.name for r in refs]
    assert names[:5] == ["ingestion", "mutation", "retention", "profile_cdc", "profile_erasure"]
    assert {"profile_processor/tenant01", "profile_processor/tenant02", "profile_segments/tenant01"} <= set(names)
    assert "profile_segments/tenant02" not in names, "a tenant's evaluations are listed once it has one"
    assert "ingest.rewards_members" in names and names[-1] == "an_old_stream"
    by_name = {r.name: r for r in refs}
    assert by_name["ingestion"].lock == "engagement_activity" and by_name["profile_cdc"].lock is None
    assert by_name["profile_processor/tenant01"].lock == "profile_raw/tenant01"
    assert "profile_raw/tenant01" in by_name["profile_processor/tenant01"].tables

    assert [r.name for r in selected(refs, "ingest/rewards_members")] == ["ingest.rewards_members"]
    assert [r.name for r in selected(refs, "profile_processor")] == [
        "profile_processor/tenant01",
        "profile_processor/tenant02",
    ]


def test_a_lake_that_does_not_answer_leaves_the_other_columns(lake, monkeypatch):
    def away(self):
        raise OSError("the object store did not answer")

    monkeypatch.setattr(LakeReads, "stream_names", away)
    monkeypatch.setenv("EP_COORDINATOR", "off")
    report = collect(wanted="ingestion")
    status = ingestion(report)
    assert (status.batch, status.lag.records, status.lag.seconds) == (UNAVAILABLE,) * 3
    assert status.lock == COORDINATOR_OFF and status.attempts == UNAVAILABLE
    services = {s.name: s for s in report.services}
    assert services["lake"].available is False and "did not answer" in services["lake"].detail
    assert services["kafka"].available is None, "where the stream stands is unknown: Kafka is not asked"
