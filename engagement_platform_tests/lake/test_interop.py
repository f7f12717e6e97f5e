"""Tables the platform writes are plain Delta: an independent reader (DuckDB's delta extension, on
delta-kernel-rs) reads the same rows as deltalake after executor-written files, a MERGE, a delete, a
z-order, a checkpoint and a vacuum."""

from __future__ import annotations

from datetime import date

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.file_writes import commit_files, write_files, writer_tag
from engagement_platform_tests.support.duckdb_reader import read_delta, same_rows
from engagement_platform_tests.support.files import SPEC, rows

COLUMNS = ["org_id", "event_id", "day", "n"]


def test_duckdb_reads_what_deltalake_reads_through_every_kind_of_commit(tmp_path):
    lake = DeltaLake(str(tmp_path / "lake"))
    uri = lake.uri(SPEC.name)
    for batch_id in (1, 2):  # files written the way Spark tasks write them, one commit per batch
        batch = rows(["a", "b", None, "a"], start=batch_id * 10, day=date(2026, 1, batch_id))
        commit_files(lake, SPEC, write_files(uri, SPEC, batch, writer_tag("app", batch_id)), BatchTxn("app", batch_id))
    assert same_rows(lake.read(SPEC.name), uri, COLUMNS)
    assert read_delta(uri, COLUMNS).num_rows == 8

    table = lake.table(SPEC.name)
    update = pa.table({"event_id": ["e00010", "e00099"], "n": [1000, 7]})
    (
        table.merge(update, predicate="t.event_id = s.event_id", source_alias="s", target_alias="t")
        .when_matched_update(updates={"n": "s.n"})
        .execute()
    )
    table = lake.table(SPEC.name)
    table.delete("event_id = 'e00011'")
    assert same_rows(lake.read(SPEC.name), uri, COLUMNS)
    assert pc.sum(read_delta(uri, ["n"])["n"]).as_py() == pc.sum(lake.read(SPEC.name)["n"]).as_py()

    table = lake.table(SPEC.name)
    table.optimize.z_order(["day"])
    table.create_checkpoint()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert same_rows(lake.read(SPEC.name), uri, COLUMNS)
    assert read_delta(uri, COLUMNS).num_rows == 7


def test_duckdb_reads_a_file_rewrite_commit_and_its_change_log_as_deltalake_does(tmp_path):
    """The mutation stream's commit shape: a file removed and its rewrite added in one commit of file actions
    (statistics written by the platform, not delta-rs), and the row-level changes in the change log table."""
    from engagement_platform.lake.change_log import CHANGE_TYPE, COMMIT_VERSION, LOGGED_BY, change_log_spec
    from engagement_platform.lake.file_writes import read_file

    lake = DeltaLake(str(tmp_path / "lake"))
    uri = lake.uri(SPEC.name)
    written = write_files(uri, SPEC, rows(["a", "a", "b"], start=0, day=date(2026, 1, 1)), writer_tag("ingest", 1))
    commit_files(lake, SPEC, written, BatchTxn("ingest", 1))
    old = next(f for f in written if f.partition_values["org_id"] == "a")
    before = read_file(uri, SPEC, old)
    after = before.filter(pc.not_equal(before["event_id"], "e00001"))
    after = after.set_column(after.schema.get_field_index("n"), "n", pc.add(after["n"], 100))
    version = commit_files(
        lake,
        SPEC,
        write_files(uri, SPEC, after, writer_tag("rewrite", 1)),
        BatchTxn("rewrite", 1),
        [old],
        {LOGGED_BY: "events_changes"},
    )
    assert same_rows(lake.read(SPEC.name), uri, COLUMNS)
    assert sorted(read_delta(uri, ["event_id"])["event_id"].to_pylist()) == ["e00000", "e00002"]

    log = change_log_spec(SPEC)
    lake.ensure(log)
    kinds = [
        ("update_preimage", before.filter(pc.equal(before["event_id"], "e00000"))),
        ("update_postimage", after),
        ("delete", before.filter(pc.equal(before["event_id"], "e00001"))),
    ]
    changes = pa.concat_tables(
        [
            t.append_column(CHANGE_TYPE, pa.array([k] * t.num_rows, pa.string())).append_column(
                COMMIT_VERSION, pa.array([version] * t.num_rows, pa.int64())
            )
            for k, t in kinds
        ]
    )
    commit_files(
        lake, log, write_files(lake.uri(log.name), log, changes, writer_tag("rewrite", 1)), BatchTxn("rewrite", 1)
    )
    log_columns = ["org_id", "event_id", CHANGE_TYPE, COMMIT_VERSION]
    assert same_rows(lake.read(log.name), lake.uri(log.name), log_columns)
    assert sorted(read_delta(lake.uri(log.name), [CHANGE_TYPE])[CHANGE_TYPE].to_pylist()) == [
        "delete",
        "update_postimage",
        "update_preimage",
    ]
