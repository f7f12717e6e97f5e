"""The backfill on the real stack: a snapshot export (JSON lines + Parquet) up to a time boundary into a
tenant's raw table, its order against CDC changes, quarantine positions, and exactly-once re-runs."""

import json

import pytest

from engagement_platform.profiles.backfill.apply import (
    QUARANTINE_PIPELINE,
    backfill_app_id,
    backfill_stream,
    backfill_tenant,
)
from engagement_platform.profiles.processor.apply import process_tenant, read_profiles
from engagement_platform.profiles.tables import QUARANTINE_PROFILE_CDC, raw_table_name
from engagement_platform_tests.support.cdc import new_topic, record, stage, stage_and_process
from engagement_platform_tests.support.crash import KILLED, after_commit, run_batch
from engagement_platform_tests.support.snapshots import UNTIL, snap, write_jsonl, write_parquet


def profiles(lake, tenant, include_deleted=False):
    return {r["primary_id"]: r for r in read_profiles(lake, tenant, include_deleted).to_pylist()}


@pytest.fixture
def export(tmp_path):
    folder = tmp_path / "export"
    folder.mkdir()
    write_jsonl(
        folder / "part-0.jsonl",
        [
            snap("1", 4, {"email": "a@x.io", "country": "DE"}, related=["2"]),
            b'{"primary_id": "broken", ',  # line 2: not JSON
            snap("2", 5, {"email": "b@x.io"}, tenant="acme"),
            snap(None, 6, {"email": "nobody@x.io"}),  # line 4: no id
            snap("4", 7, "{not json"),  # line 5: fields not an object
            snap("5", 8, {"email": "e@x.io"}, tenant="globex"),  # line 6: another tenant's row
            snap("6", 9, {"email": "late@x.io"}, ts="2026-01-05T12:00:01Z"),  # after the boundary: CDC's
            snap("3", 2, {"email": "c-old@x.io"}),
        ],
    )
    write_parquet(
        folder / "part-1.parquet",
        [
            snap("3", 3, {"email": "c@x.io", "tags": ["x"]}, related=["7"]),  # newer than line 8 of part-0
            snap("7", 1, {}),
        ],
    )
    return folder


def test_backfill_loads_json_lines_and_parquet_up_to_the_boundary(spark, lake, checkpoints, export):
    result = backfill_tenant(spark, lake, checkpoints, "acme", export, UNTIL)

    assert (result.records_read, result.rows_valid, result.rows_beyond_boundary, result.records_quarantined) == (
        10,
        6,
        1,
        4,
    )
    rows = profiles(lake, "acme")
    assert set(rows) == {"1", "2", "3", "7"}
    assert json.loads(rows["3"]["fields"]) == {"email": "c@x.io", "tags": ["x"]} and rows["3"]["cdc_seq"] == 3
    assert (rows["1"]["email"], rows["1"]["country"]) == ("a@x.io", "DE")
    assert rows["1"]["related_ids"] == ["1", "2"] and rows["2"]["related_ids"] == ["1", "2"]
    assert rows["7"]["related_ids"] == ["3", "7"] and rows["7"]["component_id"] == "3"

    quarantined = lake.read(QUARANTINE_PROFILE_CDC.name).to_pylist()
    jsonl = str(export / "part-0.jsonl")
    assert {q["row_id"]: q["error_code"] for q in quarantined} == {
        f"{jsonl}:2": "malformed_record",
        f"{jsonl}:4": "missing_required",
        f"{jsonl}:5": "invalid_json",
        f"{jsonl}:6": "tenant_mismatch",
    }
    assert {(q["pipeline"], q["org_id"], q["batch_id"]) for q in quarantined} == {(QUARANTINE_PIPELINE, "acme", 1)}

    # The same export again: already done, nothing written.
    version = lake.table(raw_table_name("acme")).version()
    again = backfill_tenant(spark, lake, checkpoints, "acme", export, UNTIL)
    assert again.already_done and again.plan.batch_id == 1
    assert lake.table(raw_table_name("acme")).version() == version
    assert lake.read(QUARANTINE_PROFILE_CDC.name).num_rows == 4


def test_snapshot_rows_order_against_cdc_changes_by_sequence(spark, kafka, lake, checkpoints, tmp_path):
    topic = new_topic(kafka)
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        topic,
        [
            record("acme", "1", 5, {"a": 1, "gone": 1}),  # older than its snapshot row: replaced whole
            record("acme", "2", 20, {"b": 2}),  # newer than its snapshot row: kept
        ],
        "acme",
    )
    folder = tmp_path / "export"
    folder.mkdir()
    write_jsonl(
        folder / "snapshot.jsonl", [snap("1", 10, {"a": 2}), snap("2", 15, {"b": 1, "x": 1}), snap("3", 3, {"c": 1})]
    )
    result = backfill_tenant(spark, lake, checkpoints, "acme", folder, UNTIL)
    assert result.rows_upserted == 2  # ids 1 and 3; id 2's row is stale
    rows = profiles(lake, "acme")
    assert {pid: json.loads(r["fields"]) for pid, r in rows.items()} == {"1": {"a": 2}, "2": {"b": 2}, "3": {"c": 1}}

    # CDC after the backfill: a change the snapshot already holds (seq 8 <= 10) is dropped, a newer one folds in.
    stage(spark, kafka, lake, checkpoints, topic, [record("acme", "1", 8, {"a": 0}), record("acme", "1", 12, {"c": 3})])
    process_tenant(spark, lake, checkpoints, "acme")
    assert json.loads(profiles(lake, "acme")["1"]["fields"]) == {"a": 2, "c": 3}


@pytest.mark.lake_stores("local", "s3")  # exactly-once on an object store too
def test_backfill_killed_after_the_merge_then_rerun_is_exactly_once(stack, lake, lake_root, checkpoints, export):
    stream, options = backfill_stream("acme"), ("--path", str(export), "--until", UNTIL)
    raw = raw_table_name("acme")
    crashed = run_batch(stream, lake_root, None, *options, failpoint=after_commit(stream, raw))
    assert crashed.returncode == KILLED, crashed.stderr[-2000:]
    assert lake.committed_version(raw, backfill_app_id("acme")) == 1
    assert not lake.exists(QUARANTINE_PROFILE_CDC.name)
    version = lake.table(raw).version()
    rerun = run_batch(stream, lake_root, 1, *options)  # resumes the unfinished batch 1
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert lake.table(raw).version() == version, "the re-run skipped the MERGE already committed"
    assert checkpoints.is_done(backfill_stream("acme"), 1)
    assert checkpoints.states(backfill_stream("acme"), 1)[raw] == "already_committed"
    assert lake.read(QUARANTINE_PROFILE_CDC.name).num_rows == 4
    assert set(profiles(lake, "acme")) == {"1", "2", "3", "7"}
