"""The backfill on the real stack: a snapshot export (JSON lines + Parquet) up to a time boundary into a
tenant's raw table, its order against CDC changes, quarantine positions, and exactly-once re-runs."""

import json
import os

import pytest

from engagement_platform.profiles.backfill.apply import (
    QUARANTINE_PIPELINE,
    backfill_app_id,
    backfill_stream,
    backfill_tenant,
)
from engagement_platform.profiles.processor.apply import process_tenant, read_profiles
from engagement_platform.profiles.tables import PROFILE_SUPPRESSED_RECORDS, QUARANTINE_PROFILE_CDC, raw_table_name
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


@pytest.fixture
def other_export(tmp_path):
    """Export B of the same tenant: another folder, one good row and one bad line."""
    folder = tmp_path / "export-b"
    folder.mkdir()
    write_jsonl(folder / "part-0.jsonl", [snap("8", 3, {"email": "h@x.io"}), b"{not json"])
    return folder


def lake_state(lake, checkpoints, tenant="acme") -> dict:
    """What a backfill can change: each table's version and rows, and the tenant's backfill plans."""
    tables = (raw_table_name(tenant), QUARANTINE_PROFILE_CDC.name, PROFILE_SUPPRESSED_RECORDS.name)
    state = {
        name: (lake.table(name).version(), lake.read(name).num_rows) if lake.exists(name) else None for name in tables
    }
    state["plans"] = [p.batch_id for p, _ in checkpoints.plans_and_done(backfill_stream(tenant))]
    return state


def quarantined_batches(lake) -> list[int]:
    return sorted(q["batch_id"] for q in lake.read(QUARANTINE_PROFILE_CDC.name).to_pylist())


def test_an_export_done_before_is_a_no_op_whatever_ran_since(spark, lake, checkpoints, export, other_export):
    first = backfill_tenant(spark, lake, checkpoints, "acme", export, UNTIL)
    second = backfill_tenant(spark, lake, checkpoints, "acme", other_export, UNTIL)
    assert (first.plan.batch_id, second.plan.batch_id, second.records_quarantined) == (1, 2, 1)
    before = lake_state(lake, checkpoints)

    again = backfill_tenant(spark, lake, checkpoints, "acme", export, UNTIL)
    assert again.already_done and again.plan.batch_id == 1 and again.records_read == 0
    assert lake_state(lake, checkpoints) == before, "no new rows, commits or plans anywhere"
    assert quarantined_batches(lake) == [1, 1, 1, 1, 2]
    # B again, after A again: done too
    assert backfill_tenant(spark, lake, checkpoints, "acme", other_export, UNTIL).plan.batch_id == 2
    assert lake_state(lake, checkpoints) == before
    # the same folder with another boundary is another export
    later = backfill_tenant(spark, lake, checkpoints, "acme", export, "2026-01-06T00:00:00Z")
    assert (later.already_done, later.plan.batch_id, later.rows_beyond_boundary) == (False, 3, 0)


def test_an_export_whose_file_changed_since_is_a_new_batch(spark, lake, checkpoints, export, other_export):
    backfill_tenant(spark, lake, checkpoints, "acme", export, UNTIL)
    backfill_tenant(spark, lake, checkpoints, "acme", other_export, UNTIL)
    part = export / "part-0.jsonl"
    text = part.read_bytes()
    part.write_bytes(text.replace(b"a@x.io", b"z@x.io"))  # rewritten in place: same name, same size
    stat = part.stat()
    os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    assert part.stat().st_size == len(text)

    changed = backfill_tenant(spark, lake, checkpoints, "acme", export, UNTIL)
    assert (changed.already_done, changed.plan.batch_id, changed.records_read) == (False, 3, 10)
    assert quarantined_batches(lake) == [1, 1, 1, 1, 2, 3, 3, 3, 3], "the changed export's own bad lines, once"
    # the stored rows win on sequence: the rewritten row (same sequence) changes nothing
    assert profiles(lake, "acme")["1"]["email"] == "a@x.io"
    assert backfill_tenant(spark, lake, checkpoints, "acme", export, UNTIL).plan.batch_id == 3


def test_the_second_run_of_an_export_crashed_anywhere_is_exactly_once(
    stack, lake, lake_root, checkpoints, export, other_export
):
    stream, raw = backfill_stream("acme"), raw_table_name("acme")
    options = ("--path", str(export), "--until", UNTIL)
    for folder in (export, other_export):
        assert run_batch(stream, lake_root, None, "--path", str(folder), "--until", UNTIL).returncode == 0
    before = lake_state(lake, checkpoints)

    # A again, with the process set to die right after the raw commit: nothing to commit, so it never gets there
    again = run_batch(stream, lake_root, None, *options, failpoint=after_commit(stream, raw))
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["already_done"] is True
    assert lake_state(lake, checkpoints) == before

    # A changed: a new batch, killed after each of its commits in turn, then re-run: each table holds it once
    part = export / "part-0.jsonl"
    part.write_bytes(part.read_bytes() + json.dumps(snap("9", 4, {"email": "i@x.io"})).encode() + b"\n")
    crashed = run_batch(stream, lake_root, None, *options, failpoint=after_commit(stream, raw))
    assert crashed.returncode == KILLED, crashed.stderr[-2000:]
    crashed = run_batch(stream, lake_root, 3, *options, failpoint=after_commit(stream, QUARANTINE_PROFILE_CDC.name))
    assert crashed.returncode == KILLED, crashed.stderr[-2000:]
    rerun = run_batch(stream, lake_root, 3, *options)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert checkpoints.is_done(stream, 3)
    assert (
        checkpoints.states(stream, 3)[raw]
        == checkpoints.states(stream, 3)[QUARANTINE_PROFILE_CDC.name]
        == "already_committed"
    )
    assert lake.committed_version(raw, backfill_app_id("acme")) == 3
    assert quarantined_batches(lake) == [1, 1, 1, 1, 2, 3, 3, 3, 3]
    assert set(profiles(lake, "acme")) == {"1", "2", "3", "7", "8", "9"}
    done = run_batch(stream, lake_root, None, *options)
    assert json.loads(done.stdout.strip().splitlines()[-1])["already_done"] is True
