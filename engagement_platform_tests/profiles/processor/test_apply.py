"""The processor on the real stack: upserts, deletes, out-of-order changes, identity cascades within
and across batches, exactly-once re-runs, and the sensor's question (unprocessed tenants)."""

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engagement_platform.profiles import snapshots
from engagement_platform.profiles.processor.apply import (
    process_tenant,
    process_tenants,
    processor_app_id,
    processor_stream,
    read_profiles,
    staged_stats_from_rows,
    unprocessed_tenants,
    z_order_raw,
)
from engagement_platform.profiles.processor.progress import latest_progress
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, PROFILE_PROGRESS, raw_table_name
from engagement_platform.spark.handoff_files import new_handoff
from engagement_platform_tests.support.cdc import new_topic, record, stage, stage_and_process
from engagement_platform_tests.support.crash import KILLED, after_commit, run_batch


@pytest.fixture
def cdc_topic(kafka):
    return new_topic(kafka)


def profiles(lake, tenant, include_deleted=False):
    return {r["primary_id"]: r for r in read_profiles(lake, tenant, include_deleted).to_pylist()}


def test_upserts_merge_fields_and_deletes_tombstone(spark, kafka, lake, checkpoints, cdc_topic):
    _, result = stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [
            record("acme", "1", 1, {"email": "a@x.io", "country": "DE", "tags": ["a", "b"]}),
            record("acme", "1", 3, {"country": None, "tags": ["c"], "score": 7}),
            record("acme", "1", 2, {"email": "old@x.io", "city": "Berlin"}),  # arrives late, still folds in by sequence
            record("acme", "2", 1, {"email": "b@x.io"}),
            record("acme", "2", 2, op="delete"),
            record("acme", "3", 5, {"email": "c@x.io"}),
        ],
        "acme",
    )
    assert (result.changes_read, result.rows_upserted, result.rows_deleted) == (6, 2, 1)
    rows = profiles(lake, "acme")
    assert set(rows) == {"1", "3"}
    assert json.loads(rows["1"]["fields"]) == {
        "email": "old@x.io",
        "country": "DE",
        "tags": ["c"],
        "score": 7,
        "city": "Berlin",
    }
    assert (rows["1"]["cdc_seq"], rows["1"]["email"], rows["1"]["country"]) == (3, "old@x.io", "DE")
    assert profiles(lake, "acme", include_deleted=True)["2"]["deleted"] is True

    # Next batch: an update, a late change older than the stored row, a late upsert of the deleted id.
    _, second = stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [
            record("acme", "3", 6, {"country": "FR"}),
            record("acme", "3", 4, {"email": "stale@x.io"}),
            record("acme", "2", 1, {"email": "resurrected@x.io"}),
            record("acme", "4", 1, {"email": "d@x.io"}),
            record("acme", "1", 9, op="delete"),
        ],
        "acme",
    )
    rows = profiles(lake, "acme")
    assert set(rows) == {"3", "4"}
    assert json.loads(rows["3"]["fields"]) == {"email": "c@x.io", "country": "FR"}
    assert second.plan.batch_id == 2 and (second.rows_upserted, second.rows_deleted) == (2, 1)

    # A folder a crashed run left behind two days ago goes with the next run; the run's own folder too.
    leftover = Path(
        new_handoff(
            str(Path(lake.root, "_handoff", "profile_processor")), datetime.now(UTC) - timedelta(days=2), "crashed"
        )
    )
    leftover.mkdir(parents=True)
    (leftover / "acme.arrow").write_bytes(b"left by a crash")
    # A newer upsert re-creates a deleted profile from empty fields.
    stage_and_process(spark, kafka, lake, checkpoints, cdc_topic, [record("acme", "2", 10, {"country": "IT"})], "acme")
    assert json.loads(profiles(lake, "acme")["2"]["fields"]) == {"country": "IT"}
    assert sorted(r["batch_id"] for r in lake.read(PROFILE_PROGRESS.name).to_pylist()) == [1, 2, 3]
    # The Spark tasks hand the MERGE sources over in files; the processor deletes them once read.
    handed = [p for p in Path(lake.root, "_handoff").rglob("*") if p.is_file()]
    assert Path(lake.root, "_handoff").is_dir() and handed == [] and not leftover.exists()


def test_identity_links_cascade_within_a_batch(spark, kafka, lake, checkpoints, cdc_topic):
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [
            record("acme", "789", 1, {}, related=["101"]),
            record("acme", "101", 2, {}, related=["789"]),
            record("acme", "103", 3, {}, related=["789", "101"]),
            record("acme", "500", 4, {}),
        ],
        "acme",
    )
    rows = profiles(lake, "acme")
    for pid in ("789", "101", "103"):
        assert rows[pid]["related_ids"] == ["101", "103", "789"] and rows[pid]["component_id"] == "101"
    assert rows["500"]["related_ids"] == ["500"]


def test_identity_cascades_across_batches_join_and_split(spark, kafka, lake, checkpoints, cdc_topic):
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [
            record("acme", "789", 1, {"a": 1}, related=["788"]),
            record("acme", "788", 1, {}),
            record("acme", "101", 2, {"b": 2}, related=["102"]),
            record("acme", "102", 2, {}),
        ],
        "acme",
    )
    assert profiles(lake, "acme")["789"]["related_ids"] == ["788", "789"]

    # 103 links 789 and 101: both stored components become one, rows untouched by the batch included.
    _, joined = stage_and_process(
        spark, kafka, lake, checkpoints, cdc_topic, [record("acme", "103", 3, {}, related=["789", "101"])], "acme"
    )
    everyone = ["101", "102", "103", "788", "789"]
    rows = profiles(lake, "acme")
    assert {pid: rows[pid]["related_ids"] for pid in rows} == {pid: everyone for pid in everyone}
    assert joined.rows_relinked == 4 and json.loads(rows["789"]["fields"]) == {"a": 1}

    # 103 drops its links: the component splits back.
    stage_and_process(spark, kafka, lake, checkpoints, cdc_topic, [record("acme", "103", 4, {}, related=[])], "acme")
    rows = profiles(lake, "acme")
    assert rows["788"]["related_ids"] == ["788", "789"] and rows["102"]["related_ids"] == ["101", "102"]
    assert rows["103"]["related_ids"] == ["103"]


def test_tenants_are_separate_and_found_by_the_sensor_question(spark, kafka, lake, checkpoints, cdc_topic):
    assert unprocessed_tenants(lake) == []
    stage(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [record("acme", "1", 1, {"x": 1}), record("globex", "1", 1, {"y": 2})],
    )
    assert unprocessed_tenants(lake) == ["acme", "globex"]
    process_tenant(spark, lake, checkpoints, "acme")
    assert unprocessed_tenants(lake) == ["globex"]
    stage(spark, kafka, lake, checkpoints, cdc_topic, [record("acme", "2", 2, {"x": 2})])
    assert unprocessed_tenants(lake) == ["acme", "globex"]
    results = process_tenants(spark, lake, checkpoints, ["acme", "globex"])
    assert {t: r.changes_read for t, r in results.items()} == {"acme": 1, "globex": 1}
    assert unprocessed_tenants(lake) == []
    assert process_tenant(spark, lake, checkpoints, "acme") is None
    assert set(profiles(lake, "acme")) == {"1", "2"} and set(profiles(lake, "globex")) == {"1"}
    assert latest_progress(lake)["acme"]["last_bucket"] == "20260105T1000"
    z_order_raw(lake, "acme")
    assert set(profiles(lake, "acme")) == {"1", "2"}


@pytest.mark.lake_stores("local", "s3")  # exactly-once on an object store too
def test_processor_killed_after_the_merge_then_rerun_is_exactly_once(
    spark, kafka, stack, lake, lake_root, checkpoints, cdc_topic
):
    stage_and_process(
        spark, kafka, lake, checkpoints, cdc_topic, [record("acme", "1", 1, {"n": 1}, related=["2"])], "acme"
    )
    stage(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [record("acme", "1", 2, {"m": 2}), record("acme", "3", 3, {}, related=["2"])],
    )

    stream, raw = processor_stream("acme"), raw_table_name("acme")
    crashed = run_batch(stream, lake_root, failpoint=after_commit(stream, raw))  # plans batch 2 itself
    assert crashed.returncode == KILLED, crashed.stderr[-2000:]
    assert lake.committed_version(raw, processor_app_id("acme")) == 2
    assert latest_progress(lake)["acme"]["batch_id"] == 1
    version = lake.table(raw).version()
    # More staged meanwhile: the re-run still finishes exactly its planned slice.
    stage(spark, kafka, lake, checkpoints, cdc_topic, [record("acme", "9", 9, {})])
    rerun = run_batch(stream, lake_root, 2)  # resumes the unfinished batch 2
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert lake.table(raw).version() == version
    assert latest_progress(lake)["acme"]["batch_id"] == 2
    rows = profiles(lake, "acme")
    assert set(rows) == {"1", "3"} and json.loads(rows["1"]["fields"]) == {"n": 1, "m": 2}
    assert rows["1"]["related_ids"] == ["1", "2", "3"]
    assert unprocessed_tenants(lake) == ["acme"]
    process_tenant(spark, lake, checkpoints, "acme")
    assert set(profiles(lake, "acme")) == {"1", "3", "9"}


@pytest.mark.lake_stores("local", "s3")
def test_batch_figures_from_the_staged_rows_equal_the_logs_statistics(spark, kafka, lake, checkpoints, cdc_topic):
    """The fallback for staged files without statistics (a writer other than the dumper) reads the rows and
    takes tenant and bucket from each row's file path: on an object store too, the same figures as the log's."""
    stage(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [
            record("acme", "1", 4, {"a": 1}),
            record("globex", "7", 2, {}),
            record("acme", "2", 9, {}, ts="2026-01-06T08:30:00Z"),
        ],
    )
    stage(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [record("acme", "3", 5, {}), record("globex", "8", 11, {}, ts="2026-01-07T23:59:00Z")],
    )
    uris = {t: sorted(files) for t, files in snapshots.files_by_tenant(lake, PROFILE_CDC_STAGING.name).items()}
    assert set(uris) == {"acme", "globex"} and all(uris.values())
    from_log = snapshots.staged_stats(lake, PROFILE_CDC_STAGING.name, uris)
    from_rows = staged_stats_from_rows(spark, lake, uris)

    def comparable(stats):
        return {
            t: {k: (v.timestamp() if hasattr(v, "timestamp") else v) for k, v in row.items()}
            for t, row in stats.items()
        }

    assert comparable(from_rows) == comparable(from_log)
    assert (
        from_rows["acme"]["changes_read"],
        from_rows["acme"]["max_cdc_seq"],
        from_rows["globex"]["max_cdc_seq"],
    ) == (3, 9, 11)
