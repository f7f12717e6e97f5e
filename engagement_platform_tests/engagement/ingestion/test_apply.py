"""The ingestion batch end to end on the real broker, Spark Connect and Delta tables, including
processes killed between the table commits and re-run."""

import json
from collections import Counter

import pyarrow.compute as pc
import pytest

from engagement_platform.engagement.ingestion.apply import APP_ID, DATA_FILES, STREAM, ingest_batch
from engagement_platform.engagement.integrity import audit_notifications, duplicate_engagement_ids
from engagement_platform.engagement.tables import (
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_NOTIFICATIONS,
    QUARANTINE_ENGAGEMENT_INGESTION,
)
from engagement_platform.ingest.record_tasks import SPARK, VECTORIZED
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.file_writes import unreferenced_files
from engagement_platform.streams.planning import plan_next_batch
from engagement_platform_tests.support.activities import BAD_RECORDS, produce_activities
from engagement_platform_tests.support.crash import crash_then_rerun, finished, killed_at
from engagement_platform_tests.support.duckdb_reader import read_delta, same_rows


def plan(kafka, checkpoints, topic, max_per_partition=10_000):
    p = plan_next_batch(STREAM, topic, checkpoints.latest_plan(STREAM), kafka.watermarks(topic), max_per_partition)
    assert checkpoints.record_plan(p)
    return p


def assert_lake_equals_kafka(lake, expected: dict, bad_count: int):
    data = lake.read(ENGAGEMENT_ACTIVITY.name).to_pylist()
    ids = Counter(r["engagement_id"] for r in data)
    assert ids == Counter(expected.keys()), "each good record exactly once, nothing missing"
    for row in data:
        src = expected[row["engagement_id"]]
        assert (row["org_id"], row["activity_type"], row["lead_id"]) == (
            src["org_id"],
            src["activity_type"],
            src["lead_id"],
        )
    notes = lake.read(ENGAGEMENT_NOTIFICATIONS.name).to_pylist()
    per_org = Counter()
    for n in notes:
        per_org[n["org_id"]] += n["inserted"]
    assert per_org == Counter(r["org_id"] for r in expected.values())
    assert len({(n["org_id"], n["batch_id"]) for n in notes}) == len(notes), "one notification per org per batch"
    quarantined = lake.read(QUARANTINE_ENGAGEMENT_INGESTION.name)
    assert pc.count_distinct(quarantined["row_id"]).as_py() == bad_count


def test_batch_appends_good_rows_quarantines_bad_ones_and_notifies(spark, kafka, topic, lake, checkpoints):
    expected = produce_activities(kafka, topic, 400, bad=BAD_RECORDS)
    p = plan(kafka, checkpoints, topic)
    result = ingest_batch(spark, lake, checkpoints, kafka.bootstrap_servers, p)

    assert (result.records_read, result.rows_appended, result.rows_rejected) == (
        400 + len(BAD_RECORDS),
        400,
        len(BAD_RECORDS),
    )
    assert_lake_equals_kafka(lake, expected, len(BAD_RECORDS))
    q = lake.read(QUARANTINE_ENGAGEMENT_INGESTION.name).to_pylist()
    assert {r["raw"] for r in q} == set(BAD_RECORDS.values())
    assert all(r["source"] == topic and r["source_offset"] is not None and r["message"] for r in q)
    assert checkpoints.is_done(STREAM, p.batch_id)
    audit = audit_notifications(
        lake, ENGAGEMENT_ACTIVITY.name, result.versions[ENGAGEMENT_ACTIVITY.name], APP_ID, p.batch_id
    )
    assert audit.orgs_mismatched == 0 and audit.rows_changed == 400


def test_an_independent_reader_reads_the_files_the_executors_wrote(spark, kafka, topic, lake, checkpoints):
    """engagement_activity's data files come from Spark tasks, not delta-rs: DuckDB's delta extension (on
    delta-kernel-rs) reads the same rows, and skips files by the statistics the tasks wrote."""
    produce_activities(kafka, topic, 300)
    ingest_batch(spark, lake, checkpoints, kafka.bootstrap_servers, plan(kafka, checkpoints, topic))
    columns = ["org_id", "engagement_id", "engagement_date", "event_time", "batch_id", "source_offset"]
    assert same_rows(lake.read(ENGAGEMENT_ACTIVITY.name), lake.uri(ENGAGEMENT_ACTIVITY.name), columns)
    assert read_delta(lake.uri(ENGAGEMENT_ACTIVITY.name), columns).num_rows == 300


def test_rerunning_a_committed_batch_changes_nothing(spark, kafka, topic, lake, checkpoints):
    expected = produce_activities(kafka, topic, 200)
    p = plan(kafka, checkpoints, topic)
    ingest_batch(spark, lake, checkpoints, kafka.bootstrap_servers, p)
    versions = {t: lake.table(t).version() for t in (ENGAGEMENT_ACTIVITY.name, ENGAGEMENT_NOTIFICATIONS.name)}
    again = ingest_batch(spark, lake, checkpoints, kafka.bootstrap_servers, p)
    assert set(again.versions.values()) == {None}
    assert {t: lake.table(t).version() for t in versions} == versions
    assert_lake_equals_kafka(lake, expected, 0)


def test_consecutive_batches_cover_the_topic_without_gaps(spark, kafka, topic, lake, checkpoints):
    expected = produce_activities(kafka, topic, 300)
    while (
        p := plan_next_batch(STREAM, topic, checkpoints.latest_plan(STREAM), kafka.watermarks(topic), 40)
    ) is not None:
        checkpoints.record_plan(p)
        ingest_batch(spark, lake, checkpoints, kafka.bootstrap_servers, p)
    assert checkpoints.latest_plan(STREAM).batch_id >= 3
    assert_lake_equals_kafka(lake, expected, 0)
    assert duplicate_engagement_ids(lake) == 0


@pytest.mark.on_cluster
@pytest.mark.lake_stores("local", "s3")  # exactly-once on an object store too
@pytest.mark.parametrize(
    "crash_after", [ENGAGEMENT_ACTIVITY.name, QUARANTINE_ENGAGEMENT_INGESTION.name, ENGAGEMENT_NOTIFICATIONS.name]
)
def test_process_killed_between_table_commits_then_rerun_is_exactly_once(
    spark, kafka, topic, lake, lake_root, checkpoints, crash_after
):
    expected = produce_activities(kafka, topic, 250, bad={"not_json": BAD_RECORDS["not_json"]})
    p = plan(kafka, checkpoints, topic)

    crash_then_rerun(lake_root, lake, checkpoints, STREAM, APP_ID, p.batch_id, crash_after)
    assert_lake_equals_kafka(lake, expected, 1)


@pytest.mark.on_cluster
def test_process_killed_after_the_executors_wrote_their_files_then_rerun_is_exactly_once(
    spark, kafka, topic, lake, lake_root, checkpoints
):
    """The Spark tasks wrote the batch's data files into the table's folder, then the process died before any
    commit: no reader sees those files, the re-run deletes them and commits its own, once."""
    expected = produce_activities(kafka, topic, 250, bad={"not_json": BAD_RECORDS["not_json"]})
    p = plan(kafka, checkpoints, topic)
    killed_at(STREAM, lake_root, p.batch_id, DATA_FILES)
    orphans = unreferenced_files(lake, ENGAGEMENT_ACTIVITY)
    assert orphans, "the executors had written files"
    assert lake.read(ENGAGEMENT_ACTIVITY.name).num_rows == 0, "uncommitted files are invisible"

    finished(STREAM, lake_root, p.batch_id)
    assert checkpoints.is_done(STREAM, p.batch_id)
    assert unreferenced_files(lake, ENGAGEMENT_ACTIVITY) == [], "the dead attempt's files are gone"
    assert_lake_equals_kafka(lake, expected, 1)


def test_duplicate_in_batch_is_quarantined_with_its_own_raw_bytes(spark, kafka, topic, lake, checkpoints):
    expected = produce_activities(kafka, topic, 40)
    replayed = produce_activities(kafka, topic, 3)  # the same generator seed: ids e..01-03 again
    dup_raw = {json.dumps(r).encode() for r in replayed.values()}
    p = plan(kafka, checkpoints, topic)
    result = ingest_batch(spark, lake, checkpoints, kafka.bootstrap_servers, p)

    assert (result.rows_appended, result.rows_rejected) == (40, 3)
    assert_lake_equals_kafka(lake, expected, 3)
    q = lake.read(QUARANTINE_ENGAGEMENT_INGESTION.name).to_pylist()
    assert {r["error_code"] for r in q} == {"duplicate_in_batch"}
    assert {r["raw"] for r in q} == dup_raw
    first_offsets = {
        (r["source_partition"], r["source_offset"]) for r in lake.read(ENGAGEMENT_ACTIVITY.name).to_pylist()
    }
    assert all((r["source_partition"], r["source_offset"]) not in first_offsets for r in q)


def test_a_key_sent_again_in_a_later_batch_is_quarantined_not_appended(
    spark, kafka, topic, lake, lake_root, checkpoints
):
    """A producer retry or replay re-sends activities at new offsets: the table keeps the first copy, the
    later one goes to quarantine with its raw bytes, also when the batch is re-run after a crash."""
    expected = produce_activities(kafka, topic, 30)
    ingest_batch(spark, lake, checkpoints, kafka.bootstrap_servers, plan(kafka, checkpoints, topic))
    resent = produce_activities(kafka, topic, 5)  # the same generator seed: the first 5 ids again
    fresh = produce_activities(kafka, topic, 4, seed=9)
    p = plan(kafka, checkpoints, topic)
    crash_then_rerun(lake_root, lake, checkpoints, STREAM, APP_ID, p.batch_id, QUARANTINE_ENGAGEMENT_INGESTION.name)

    assert_lake_equals_kafka(lake, {**expected, **fresh}, 5)
    q = lake.read(QUARANTINE_ENGAGEMENT_INGESTION.name).to_pylist()
    assert {r["error_code"] for r in q} == {"already_in_table"} and {r["batch_id"] for r in q} == {p.batch_id}
    assert {r["raw"] for r in q} == {json.dumps(r).encode() for r in resent.values()}
    assert all("written by batch 1" in r["message"] for r in q)
    assert duplicate_engagement_ids(lake) == 0


def test_the_vectorized_record_path_writes_what_the_spark_path_writes(spark, kafka, topic, lake, checkpoints, tmp_path):
    """The same slice through the DuckDB plan in the tasks and through Spark's parser: the same activity rows
    and the same quarantine reasons at the same positions."""
    produce_activities(kafka, topic, 300, bad=BAD_RECORDS)
    p = plan(kafka, checkpoints, topic)
    vectorized = ingest_batch(spark, lake, checkpoints, kafka.bootstrap_servers, p)
    spark_lake = DeltaLake(str(tmp_path / "spark_path"))
    spark_checkpoints = CheckpointStore(spark_lake)
    assert spark_checkpoints.record_plan(p)
    on_spark = ingest_batch(spark, spark_lake, spark_checkpoints, kafka.bootstrap_servers, p, record_path=SPARK)

    assert (vectorized.record_path, on_spark.record_path) == (VECTORIZED, SPARK)
    assert (vectorized.rows_appended, vectorized.rows_rejected) == (on_spark.rows_appended, on_spark.rows_rejected)

    def rows(at):
        table = at.read(ENGAGEMENT_ACTIVITY.name).drop_columns(["ingestion_time"])
        return sorted(table.to_pylist(), key=lambda r: r["engagement_id"])

    def reasons(at):
        q = at.read(QUARANTINE_ENGAGEMENT_INGESTION.name).to_pylist()
        return sorted((r["source_partition"], r["source_offset"], r["error_code"], r["raw"]) for r in q)

    assert rows(lake) == rows(spark_lake) and len(rows(lake)) == 300
    assert reasons(lake) == reasons(spark_lake)
