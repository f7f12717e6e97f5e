"""Tables the platform writes are plain Delta: an independent reader (DuckDB's delta extension, on
delta-kernel-rs) reads the same rows as deltalake after executor-written files, a MERGE, a delete, a
z-order, a checkpoint and a vacuum."""

from __future__ import annotations

from datetime import date

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.file_writes import commit_files, write_files, writer_tag
from engagement_platform_tests.support.files import SPEC, rows
from engagement_platform_tests.support.duckdb_reader import read_delta, same_rows

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
    (table.merge(update, predicate="t.event_id = s.event_id", source_alias="s", target_alias="t")
     .when_matched_update(updates={"n": "s.n"}).execute())
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
