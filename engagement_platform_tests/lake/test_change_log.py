"""The change log of a table whose writer commits file actions without change-data files: a commit that
removes a file and adds its rewrite reads, through changes_since and change_counts, as exactly the rows
the log holds for it (not the file-level change data feed), while appends and delta-rs deletes in the
same range still come from the change data feed; the log's step is exactly-once like every step."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engagement_platform.engagement.tables import ENGAGEMENT_NOTIFICATIONS
from engagement_platform.lake.change_log import (
    CHANGE_TYPE,
    COMMIT_VERSION,
    LOGGED_BY,
    change_log_files_step,
    change_log_spec,
    change_log_step,
    logged_changes,
    logged_versions,
)
from engagement_platform.lake.changes import START, changes_since, unlogged_runs
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.file_writes import (
    WrittenFile,
    commit_files,
    read_file,
    unreferenced_files,
    write_files,
    writer_tag,
)
from engagement_platform.lake.notifications import audit_notifications, change_counts
from engagement_platform.streams.batch import CommitStep, commit_batch
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.notify import notification_step
from engagement_platform.streams.planning import BatchPlan, KafkaSlice
from engagement_platform_tests.support.files import SPEC, rows

LOG = change_log_spec(SPEC)
NOTES = ENGAGEMENT_NOTIFICATIONS
INGEST, REWRITE, ERASE = "events.ingest", "events.rewrite", "events.erase"
AT = datetime(2026, 1, 6, tzinfo=UTC)


def plan(stream: str, batch_id: int) -> BatchPlan:
    return BatchPlan(stream, batch_id, KafkaSlice("t", (OffsetRange(0, 0, 1),)))


def notify(lake: DeltaLake, checkpoints: CheckpointStore, app: str, batch_id: int) -> None:
    """The notification rows of a commit `app` made for `batch_id` (counted by change_counts)."""
    p = plan(app, batch_id)
    commit_batch(p, app, [notification_step(lake, NOTES, SPEC.name, app, p, AT)], checkpoints)


def ingest(
    lake: DeltaLake, checkpoints: CheckpointStore, orgs: list[str], start: int, batch_id: int
) -> tuple[int, list[WrittenFile]]:
    """An append of files written outside delta-rs (its change data feed is exact: adds are inserts)."""
    files = write_files(lake.uri(SPEC.name), SPEC, rows(orgs, start=start), writer_tag(INGEST, batch_id))
    version = commit_files(lake, SPEC, files, BatchTxn(INGEST, batch_id))
    notify(lake, checkpoints, INGEST, batch_id)
    return version, files


def of_kind(table: pa.Table, kind: str) -> pa.Table:
    return table.append_column(CHANGE_TYPE, pa.array([kind] * table.num_rows, pa.string()))


def rewrite(old: pa.Table) -> tuple[pa.Table, pa.Table]:
    """A file's rows after the batch (e00000's note changed, e00001 deleted, the rest as they were),
    and the row-level changes: data columns + _change_type."""
    ids = old["event_id"]
    after = old.filter(pc.not_equal(ids, "e00001"))
    after = after.set_column(
        after.schema.get_field_index("note"),
        "note",
        pc.if_else(pc.equal(after["event_id"], "e00000"), "changed", after["note"]),
    )
    changes = pa.concat_tables(
        [
            of_kind(old.filter(pc.equal(ids, "e00000")), "update_preimage"),
            of_kind(after.filter(pc.equal(after["event_id"], "e00000")), "update_postimage"),
            of_kind(old.filter(pc.equal(ids, "e00001")), "delete"),
        ]
    )
    return after, changes


def rewrite_batch(lake: DeltaLake, removed: WrittenFile, batch_id: int) -> tuple[list[CommitStep], pa.Table]:
    """The steps of a batch that rewrites one file as the mutation stream does: the data commit (the
    rewrite's add and the old file's remove, no CDC files), its change log rows, its notifications."""
    old = read_file(lake.uri(SPEC.name), SPEC, removed)
    after, changes = rewrite(old)
    adds = write_files(lake.uri(SPEC.name), SPEC, after, writer_tag(REWRITE, batch_id))
    steps = [
        CommitStep(SPEC.name, lambda txn, _: commit_files(lake, SPEC, adds, txn, [removed], {LOGGED_BY: LOG.name})),
        change_log_step(lake, LOG, SPEC.name, REWRITE, batch_id, changes),
        notification_step(lake, NOTES, SPEC.name, REWRITE, plan(REWRITE, batch_id), AT),
    ]
    return steps, changes


def changed(table: pa.Table) -> list[tuple[int, str, str, str]]:
    return sorted((int(r[COMMIT_VERSION]), r[CHANGE_TYPE], r["event_id"], r["note"]) for r in table.to_pylist())


def test_the_log_spec_follows_the_data_table():
    assert LOG.name == "events_changes"
    assert LOG.schema.names == [*SPEC.schema.names, CHANGE_TYPE, COMMIT_VERSION]
    assert LOG.schema.field(COMMIT_VERSION).type == pa.int64() and LOG.schema.field(CHANGE_TYPE).type == pa.string()
    assert LOG.partition_by == SPEC.partition_by and not LOG.change_data_feed
    assert COMMIT_VERSION in LOG.stats_columns and set(SPEC.stats_columns) <= set(LOG.stats_columns)
    assert change_log_spec(SPEC, "other").name == "other"


def test_a_rewrite_reads_as_its_logged_rows_between_feed_versions(lake, checkpoints):
    v1, files = ingest(lake, checkpoints, ["a", "a", "a", "b"], 0, 1)
    steps, changes = rewrite_batch(lake, next(f for f in files if f.partition_values["org_id"] == "a"), 1)
    outcomes = commit_batch(plan(REWRITE, 1), REWRITE, steps, checkpoints)
    v2 = outcomes[SPEC.name]
    assert outcomes[LOG.name] is not None
    deleted = lake.delete(SPEC, "event_id = 'e00002'", BatchTxn(ERASE, 1))  # delta-rs writes CDC files: not logged
    v3 = deleted["version"]
    notify(lake, checkpoints, ERASE, 1)
    v4, _ = ingest(lake, checkpoints, ["a"], 10, 2)

    # What the change data feed alone says of the rewrite: every row of both files, file-level.
    feed = lake.changes(SPEC.name, v2, v2)
    assert sorted(feed[CHANGE_TYPE].to_pylist()) == ["delete"] * 3 + ["insert"] * 2

    assert logged_versions(lake, SPEC.name, v1, v4) == [v2]
    assert changed(logged_changes(lake, LOG.name, [v2], "a")) == changed(
        changes.append_column(COMMIT_VERSION, pa.array([v2] * 3))
    )
    cs = changes_since(lake, NOTES, SPEC.name, "a", START)
    assert cs.table_versions == [v1, v2, v3, v4]
    assert changed(cs.rows) == [
        (v1, "insert", "e00000", "x"),
        (v1, "insert", "e00001", "x"),
        (v1, "insert", "e00002", "x"),
        (v2, "delete", "e00001", "x"),
        (v2, "update_postimage", "e00000", "changed"),
        (v3, "delete", "e00002", "x"),
        (v4, "insert", "e00010", "x"),
    ]
    assert cs.rows[COMMIT_VERSION].to_pylist() == sorted(cs.rows[COMMIT_VERSION].to_pylist())
    # One layout whatever the source: the change feed's columns, and the data commit's timestamp.
    assert cs.rows.schema == lake.changes(SPEC.name, v1, v1).schema
    stamps = {int(h["version"]): h["timestamp"] for h in lake.table(SPEC.name).history()}
    logged_rows = cs.rows.filter(pc.equal(cs.rows[COMMIT_VERSION], v2)).to_pylist()
    assert {round(r["_commit_timestamp"].replace(tzinfo=UTC).timestamp() * 1000) for r in logged_rows} == {stamps[v2]}

    assert changes_since(lake, NOTES, SPEC.name, "b", START).table_versions == [v1], "the rewrite did not touch org b"
    assert change_counts(lake, SPEC.name, v2) == {"a": {"inserted": 0, "updated": 1, "deleted": 1}}
    assert change_counts(lake, SPEC.name, v3) == {"a": {"inserted": 0, "updated": 0, "deleted": 1}}
    assert change_counts(lake, SPEC.name, v1) == {
        "a": {"inserted": 3, "updated": 0, "deleted": 0},
        "b": {"inserted": 1, "updated": 0, "deleted": 0},
    }
    audit = audit_notifications(lake, NOTES.name, SPEC.name, v2, REWRITE, 1)
    assert audit.orgs_mismatched == 0 and audit.rows_changed == audit.rows_notified == 2


def test_the_change_feed_is_never_read_at_a_logged_version(lake, checkpoints):
    _, files = ingest(lake, checkpoints, ["a", "a", "a"], 0, 1)
    after_ingest = changes_since(lake, NOTES, SPEC.name, "a", START).checkpoint
    v2 = commit_batch(plan(REWRITE, 1), REWRITE, rewrite_batch(lake, files[0], 1)[0], checkpoints)[SPEC.name]
    v3 = lake.delete(SPEC, "event_id = 'e00002'", BatchTxn(ERASE, 1))["version"]
    notify(lake, checkpoints, ERASE, 1)
    os.remove(f"{lake.uri(SPEC.name)}/{files[0].path}")  # the file the rewrite removed is gone, as after a vacuum
    with pytest.raises(Exception, match=files[0].path.rsplit("/", 1)[-1]):
        lake.changes(SPEC.name, v2, v2)  # so the rewrite's change feed cannot be read any more
    cs = changes_since(lake, NOTES, SPEC.name, "a", after_ingest)
    assert changed(cs.rows) == [
        (v2, "delete", "e00001", "x"),
        (v2, "update_postimage", "e00000", "changed"),
        (v3, "delete", "e00002", "x"),
    ]


def test_a_rerun_logs_nothing_twice_and_finds_its_data_commit_by_txn(lake, checkpoints):
    _, files = ingest(lake, checkpoints, ["a", "a"], 0, 1)
    steps, _ = rewrite_batch(lake, files[0], 1)
    data, log_step, _ = steps
    v2 = data.commit(BatchTxn(REWRITE, 1), {})  # the attempt that died right after the data commit
    outcomes = commit_batch(plan(REWRITE, 1), REWRITE, [data, log_step], checkpoints)
    assert outcomes == {SPEC.name: None, LOG.name: outcomes[LOG.name]} and outcomes[LOG.name] is not None
    logged = lake.read(LOG.name)
    assert logged.num_rows == 3 and set(logged[COMMIT_VERSION].to_pylist()) == {v2}, "the version found by the txn"
    log_version = lake.table(LOG.name).version()
    assert commit_batch(plan(REWRITE, 1), REWRITE, [data, log_step], checkpoints) == {SPEC.name: None, LOG.name: None}
    assert lake.table(LOG.name).version() == log_version and lake.read(LOG.name).num_rows == 3


def test_a_batch_without_a_data_commit_logs_no_rows(lake, checkpoints):
    _, files = ingest(lake, checkpoints, ["a", "a"], 0, 1)
    _, changes = rewrite(read_file(lake.uri(SPEC.name), SPEC, files[0]))
    nothing = CommitStep(SPEC.name, lambda txn, _: None)  # nothing to change: no commit
    outcomes = commit_batch(
        plan(REWRITE, 5), REWRITE, [nothing, change_log_step(lake, LOG, SPEC.name, REWRITE, 5, changes)], checkpoints
    )
    assert outcomes[LOG.name] is not None, "the step still commits its txn"
    assert lake.committed_version(LOG.name, REWRITE) == 5 and lake.read(LOG.name).num_rows == 0
    assert logged_versions(lake, SPEC.name, 0, lake.table(SPEC.name).version()) == []


def test_rows_with_an_unknown_change_type_are_refused_before_any_commit(lake):
    bad = rows(["a"]).append_column(CHANGE_TYPE, pa.array(["upsert"]))
    with pytest.raises(ValueError, match="upsert"):
        change_log_step(lake, LOG, SPEC.name, REWRITE, 1, bad)
    assert not lake.exists(LOG.name)


def test_the_log_is_read_by_version_with_file_skipping(lake, checkpoints):
    _, files = ingest(lake, checkpoints, ["a", "a"], 0, 1)
    steps, _ = rewrite_batch(lake, files[0], 1)
    commit_batch(plan(REWRITE, 1), REWRITE, steps, checkpoints)
    stats = lake.file_stats(LOG.name)
    assert f"min.{COMMIT_VERSION}" in stats.column_names and f"max.{COMMIT_VERSION}" in stats.column_names
    assert logged_changes(lake, "no_such_log", [1]).num_rows == 0
    assert logged_changes(lake, LOG.name, []).num_rows == 0


@given(st.lists(st.integers(0, 40), unique=True).map(sorted), st.lists(st.integers(0, 40), unique=True).map(sorted))
def test_feed_runs_cover_the_unlogged_versions_and_never_a_logged_one(versions, logged):
    runs = unlogged_runs(versions, logged)
    assert [v for run in runs for v in run] == [v for v in versions if v not in set(logged)]
    for run in runs:
        assert not [x for x in logged if run[0] <= x <= run[-1]], "a run's read would cover a logged commit"
    for before, after in zip(runs, runs[1:]):
        assert [x for x in logged if before[-1] < x < after[0]], "runs are split only at a logged version"


def test_a_version_whose_logged_rows_were_all_erased_reads_as_no_rows_not_as_its_file_level_feed(lake, checkpoints):
    """Erasure deletes the subject's rows from the log too. The version stays logged (its commit says so):
    readers get nothing for it, never the commit's file-level change data feed."""
    _, files = ingest(lake, checkpoints, ["a", "a", "a"], 0, 1)
    steps, _ = rewrite_batch(lake, files[0], 1)
    v2 = commit_batch(plan(REWRITE, 1), REWRITE, steps, checkpoints)[SPEC.name]
    erased = lake.delete(LOG, "event_id IN ('e00000', 'e00001')", BatchTxn(ERASE, 1))
    assert erased["num_deleted_rows"] == 3 and logged_changes(lake, LOG.name, [v2], "a").num_rows == 0

    assert logged_versions(lake, SPEC.name, v2, v2) == [v2]
    cs = changes_since(lake, NOTES, SPEC.name, "a", START)
    assert v2 in cs.table_versions
    assert [r for r in cs.rows.to_pylist() if r[COMMIT_VERSION] == v2] == []
    assert change_counts(lake, SPEC.name, v2) == {}


def test_log_files_stamped_with_an_expected_version_another_commit_took_are_restamped(lake, checkpoints):
    """Writers stamp the log files with the version they expect the data commit to get; when another commit
    took it, the step rewrites them with the data commit's actual version before committing them."""
    _, files = ingest(lake, checkpoints, ["a", "a", "a"], 0, 1)
    old = read_file(lake.uri(SPEC.name), SPEC, files[0])
    after, changes = rewrite(old)
    adds = write_files(lake.uri(SPEC.name), SPEC, after, writer_tag(REWRITE, 1))
    expected = lake.table(SPEC.name).version() + 1
    stamped = changes.append_column(COMMIT_VERSION, pa.repeat(pa.scalar(expected, pa.int64()), changes.num_rows))
    lake.ensure(LOG)
    log_files = write_files(lake.uri(LOG.name), LOG, stamped, writer_tag(REWRITE, 1))
    lake.delete(SPEC, "event_id = 'e00002'", BatchTxn(ERASE, 1))  # another writer takes the expected version
    steps = [
        CommitStep(SPEC.name, lambda txn, _: commit_files(lake, SPEC, adds, txn, [files[0]], {LOGGED_BY: LOG.name})),
        change_log_files_step(lake, LOG, SPEC.name, REWRITE, 1, log_files, expected),
    ]
    version = commit_batch(plan(REWRITE, 1), REWRITE, steps, checkpoints)[SPEC.name]
    assert version == expected + 1
    assert set(lake.read(LOG.name)[COMMIT_VERSION].to_pylist()) == {version}
    assert changed(logged_changes(lake, LOG.name, [version])) == changed(
        changes.append_column(COMMIT_VERSION, pa.array([version] * 3))
    )
    assert not [f for f in unreferenced_files(lake, LOG) if writer_tag(REWRITE, 1) in f], "the stale stamps are deleted"
