"""DeltaLake over real delta-rs tables on tmp_path: creation, exactly-once commits, CDF, upkeep."""

from __future__ import annotations

import os
from datetime import date, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec, sql_literal

SPEC = TableSpec(
    name="events",
    schema=pa.schema(
        [
            ("org_id", pa.string()),
            ("event_id", pa.string()),
            ("engagement_date", pa.date32()),
            ("amount", pa.int64()),
            ("payload", pa.string()),
        ]
    ),
    partition_by=("org_id",),
    stats_columns=("engagement_date", "event_id"),
    target_file_size=4 * 1024 * 1024,
    description="test events",
)

D0 = date(2024, 3, 1)


def rows(items: list[tuple[str, str, date, int]]) -> pa.Table:
    return pa.Table.from_pylist(
        [dict(org_id=o, event_id=e, engagement_date=d, amount=a, payload=f'{{"e":"{e}"}}') for o, e, d, a in items],
        schema=SPEC.schema,
    )


def sorted_rows(table: pa.Table) -> list[dict]:
    return sorted(table.select(SPEC.schema.names).to_pylist(), key=lambda r: (r["org_id"], r["event_id"]))


def count(lake: DeltaLake, name: str = SPEC.name) -> int:
    return lake.read(name).num_rows


def build_fragmented(lake: DeltaLake, spec: TableSpec = SPEC, appends: int = 6) -> list[dict]:
    """Several small appends (each a file per org partition); returns the expected rows."""
    expected = []
    for i in range(appends):
        batch = [
            (org, f"{org}-{i}-{j}", D0 + timedelta(days=(i * 3 + j) % 10), i * 10 + j)
            for org in ("a", "b")
            for j in range(3)
        ]
        assert lake.append(spec, rows(batch), BatchTxn("frag", i + 1)) is not None
        expected += rows(batch).to_pylist()
    return sorted(expected, key=lambda r: (r["org_id"], r["event_id"]))


# ---- creation ---------------------------------------------------------------------------------


def test_ensure_creates_table_with_partitions_and_configuration(lake):
    assert not lake.exists(SPEC.name)
    table = lake.ensure(SPEC)
    assert lake.exists(SPEC.name)
    assert table.version() == 0
    meta = lake.table(SPEC.name).metadata()
    assert meta.partition_columns == ["org_id"]
    assert meta.name == SPEC.name
    conf = meta.configuration
    assert conf["delta.enableChangeDataFeed"] == "true"
    assert conf["delta.dataSkippingStatsColumns"] == "engagement_date,event_id"
    assert conf["delta.targetFileSize"] == str(4 * 1024 * 1024)
    assert [f.name for f in lake.table(SPEC.name).schema().fields] == SPEC.schema.names
    assert count(lake) == 0


def test_ensure_is_idempotent(lake):
    lake.ensure(SPEC)
    lake.append(SPEC, rows([("a", "e1", D0, 1)]), BatchTxn("w", 1))
    again = lake.ensure(SPEC)
    assert again.version() == 1  # opened, not re-created
    assert count(lake) == 1


def test_configuration_without_cdf_or_stats():
    spec = TableSpec("plain", SPEC.schema, change_data_feed=False)
    conf = spec.configuration()
    assert conf["delta.enableChangeDataFeed"] == "false"
    assert "delta.dataSkippingStatsColumns" not in conf
    assert conf["delta.targetFileSize"] == str(128 * 1024 * 1024)


# ---- exactly-once appends -----------------------------------------------------------------------


def test_append_is_idempotent_per_txn(lake):
    first = lake.append(SPEC, rows([("a", "e1", D0, 1), ("b", "e2", D0, 2)]), BatchTxn("writer", 1))
    assert first == 1
    assert count(lake) == 2

    # Same batch again (a retry): no commit, no rows.
    assert lake.append(SPEC, rows([("a", "e1", D0, 1), ("b", "e2", D0, 2)]), BatchTxn("writer", 1)) is None
    assert lake.table(SPEC.name).version() == 1
    assert count(lake) == 2

    # An older batch is also a no-op.
    assert lake.append(SPEC, rows([("a", "e0", D0, 0)]), BatchTxn("writer", 0)) is None
    assert count(lake) == 2

    # The next batch appends.
    second = lake.append(SPEC, rows([("a", "e3", D0, 3)]), BatchTxn("writer", 2))
    assert second == 2
    assert count(lake) == 3

    # Another writer has its own txn sequence.
    assert lake.append(SPEC, rows([("a", "o1", D0, 9)]), BatchTxn("other", 1)) == 3
    assert count(lake) == 4


def test_committed_version(lake):
    lake.ensure(SPEC)
    assert lake.committed_version(SPEC.name, "writer") is None
    lake.append(SPEC, rows([("a", "e1", D0, 1)]), BatchTxn("writer", 5))
    assert lake.committed_version(SPEC.name, "writer") == 5
    assert lake.committed_version(SPEC.name, "nobody") is None
    assert lake.already_committed(SPEC.name, BatchTxn("writer", 5))
    assert lake.already_committed(SPEC.name, BatchTxn("writer", 4))
    assert not lake.already_committed(SPEC.name, BatchTxn("writer", 6))
    lake.append(SPEC, rows([("a", "e2", D0, 2)]), BatchTxn("writer", 8))
    assert lake.committed_version(SPEC.name, "writer") == 8


def test_append_selects_and_casts_to_schema(lake):
    # Extra column, different column order, int32 amount: stored as the spec's schema.
    src = pa.table(
        {
            "amount": pa.array([5], pa.int32()),
            "extra": ["x"],
            "payload": ["{}"],
            "engagement_date": pa.array([D0], pa.date32()),
            "event_id": ["e1"],
            "org_id": ["a"],
        }
    )
    assert lake.append(SPEC, src, BatchTxn("w", 1)) == 1
    out = lake.read(SPEC.name)
    assert "extra" not in out.schema.names
    assert out.schema.field("amount").type == pa.int64()
    assert out.to_pylist()[0]["amount"] == 5


def test_find_batch_commit_from_history(lake):
    lake.append(SPEC, rows([("a", "e1", D0, 1)]), BatchTxn("writer", 1, {"stream": "s1"}))
    lake.append(SPEC, rows([("a", "x1", D0, 1)]), BatchTxn("other", 2))
    lake.append(SPEC, rows([("a", "e2", D0, 2)]), BatchTxn("writer", 2, {"stream": "s1"}))
    lake.append(SPEC, rows([("a", "e3", D0, 3)]), BatchTxn("writer", 3))

    assert lake.find_batch_commit(SPEC.name, "writer", 1) == 1
    assert lake.find_batch_commit(SPEC.name, "other", 2) == 2
    assert lake.find_batch_commit(SPEC.name, "writer", 2) == 3
    assert lake.find_batch_commit(SPEC.name, "writer", 3) == 4
    assert lake.find_batch_commit(SPEC.name, "writer", 4) is None
    assert lake.find_batch_commit(SPEC.name, "nobody", 1) is None

    # The custom metadata is in the commit info.
    commit = next(c for c in lake.history(SPEC.name) if c["version"] == 3)
    assert commit["app_id"] == "writer" and commit["batch_id"] == "2" and commit["stream"] == "s1"

    # The version found really holds the batch's rows.
    v = lake.find_batch_commit(SPEC.name, "writer", 2)
    cdf = lake.changes(SPEC.name, v, v)
    assert cdf["event_id"].to_pylist() == ["e2"]


class CommitAfterNextLoad(DeltaLake):
    """A lake where another writer commits right after the next load of SPEC's table (`race()`): the moment
    between loading a table and reading its history, made to happen."""

    racing = 0

    def race(self) -> None:
        self.racing += 1

    def table(self, name, version=None):
        loaded = super().table(name, version)
        if name == SPEC.name and self.racing:
            self.racing -= 1
            DeltaLake(self.root).append(SPEC, rows([("a", "late", D0, 0)]), BatchTxn("late", loaded.version()))
        return loaded


def test_history_numbers_each_commit_by_its_own_version_while_another_writer_commits(tmp_path):
    lake = CommitAfterNextLoad(str(tmp_path / "lake"))
    for batch in (1, 2, 3):
        lake.append(SPEC, rows([("a", f"e{batch}", D0, batch)]), BatchTxn("writer", batch))

    # delta-rs's own history() reads the newest commits but numbers them from the version it loaded
    # (why every reader goes through DeltaLake.history): the racing commit 4 reads as version 3
    lake.race()
    raw = lake.table(SPEC.name)
    assert (
        raw.version() == 3 and raw.history(limit=1)[0]["app_id"] == "late" and raw.history(limit=1)[0]["version"] == 3
    )

    lake.race()
    history = lake.history(SPEC.name)
    latest = DeltaLake(lake.root).table(SPEC.name).version()
    assert not lake.racing and latest == 5, "the racing commit was made while history was read"
    assert [c["version"] for c in history] == list(range(latest, -1, -1))
    for commit in history[:-1]:  # each commit's number is the version holding its rows (version 0 creates the table)
        (changed,) = lake.changes(SPEC.name, commit["version"], commit["version"])["event_id"].to_pylist()
        assert changed == ("late" if commit["app_id"] == "late" else f"e{commit['batch_id']}")
    lake.race()
    assert [c["version"] for c in lake.history(SPEC.name, since=2)] == [6, 5, 4, 3, 2]


# ---- delete / merge ---------------------------------------------------------------------------


def test_delete_with_predicate_and_txn_is_idempotent(lake):
    lake.append(SPEC, rows([("a", "e1", D0, 1), ("a", "e2", D0, 2), ("b", "e1", D0, 3)]), BatchTxn("w", 1))
    result = lake.delete(SPEC, f"org_id = 'a' AND event_id = {sql_literal('e1')}", BatchTxn("deleter", 1))
    assert result is not None
    assert result["num_deleted_rows"] == 1
    assert result["version"] == 2
    assert sorted_rows(lake.read(SPEC.name)) == sorted_rows(rows([("a", "e2", D0, 2), ("b", "e1", D0, 3)]))

    # Retry of the same delete batch: nothing committed.
    assert lake.delete(SPEC, "org_id = 'a'", BatchTxn("deleter", 1)) is None
    assert lake.table(SPEC.name).version() == 2
    assert count(lake) == 2

    # Next delete batch runs.
    again = lake.delete(SPEC, "org_id = 'a'", BatchTxn("deleter", 2))
    assert again["num_deleted_rows"] == 1 and again["version"] == 3
    assert lake.read(SPEC.name)["org_id"].to_pylist() == ["b"]
    assert lake.committed_version(SPEC.name, "deleter") == 2


def test_delete_with_quoted_value_via_sql_literal(lake):
    lake.append(SPEC, rows([("o'brien", "e1", D0, 1), ("obrien", "e1", D0, 2)]), BatchTxn("w", 1))
    org = "o'brien"
    result = lake.delete(SPEC, "org_id = " + sql_literal(org), BatchTxn("d", 1))
    assert result["num_deleted_rows"] == 1
    assert lake.read(SPEC.name)["org_id"].to_pylist() == ["obrien"]


def test_merge_updates_and_inserts(lake):
    lake.append(SPEC, rows([("a", "e1", D0, 1), ("a", "e2", D0, 2), ("b", "e1", D0, 3)]), BatchTxn("w", 1))
    source = rows([("a", "e2", D0, 20), ("a", "e9", D0, 90)])
    merger = lake.merge(SPEC, source, "t.org_id = s.org_id AND t.event_id = s.event_id", BatchTxn("merger", 1))
    metrics = merger.when_matched_update({"amount": "s.amount"}).when_not_matched_insert_all().execute()
    assert metrics["num_target_rows_updated"] == 1
    assert metrics["num_target_rows_inserted"] == 1
    out = {(r["org_id"], r["event_id"]): r["amount"] for r in lake.read(SPEC.name).to_pylist()}
    assert out == {("a", "e1"): 1, ("a", "e2"): 20, ("a", "e9"): 90, ("b", "e1"): 3}
    # The merge commit carries the txn.
    assert lake.committed_version(SPEC.name, "merger") == 1
    assert lake.find_batch_commit(SPEC.name, "merger", 1) == 2


# ---- change data feed -------------------------------------------------------------------------


def test_changes_insert_delete_update_with_plain_strings(lake):
    v1 = lake.append(SPEC, rows([("a", "e1", D0, 1), ("a", "e2", D0, 2), ("b", "e3", D0, 3)]), BatchTxn("w", 1))
    v2 = lake.delete(SPEC, "event_id = 'e1'", BatchTxn("d", 1))["version"]
    lake.merge(SPEC, rows([("a", "e2", D0, 22)]), "t.event_id = s.event_id", BatchTxn("m", 1)).when_matched_update(
        {"amount": "s.amount"}
    ).execute()
    v3 = lake.table(SPEC.name).version()
    assert (v1, v2, v3) == (1, 2, 3)

    cdf = lake.changes(SPEC.name, 0)
    for f in cdf.schema:
        assert not pa.types.is_string_view(f.type), f
        assert not pa.types.is_large_string(f.type), f
    assert cdf.schema.field("_change_type").type == pa.string()
    assert cdf.schema.field("org_id").type == pa.string()
    assert cdf.schema.field("event_id").type == pa.string()

    got = sorted((int(r["_commit_version"]), r["_change_type"], r["event_id"], r["amount"]) for r in cdf.to_pylist())
    assert got == [
        (1, "insert", "e1", 1),
        (1, "insert", "e2", 2),
        (1, "insert", "e3", 3),
        (2, "delete", "e1", 1),
        (3, "update_postimage", "e2", 22),
        (3, "update_preimage", "e2", 2),
    ]
    # String columns compare / sort as plain strings.
    assert cdf.sort_by("event_id")["event_id"].to_pylist()[0] == "e1"

    # Version bounds and predicate.
    only_v2 = lake.changes(SPEC.name, 2, 2)
    assert [(r["_change_type"], r["event_id"]) for r in only_v2.to_pylist()] == [("delete", "e1")]
    org_b = lake.changes(SPEC.name, 0, predicate="org_id = 'b'")
    assert [(r["_change_type"], r["event_id"]) for r in org_b.to_pylist()] == [("insert", "e3")]

    # Past the end: allowed, empty.
    assert lake.changes(SPEC.name, 10).num_rows == 0


# ---- layout upkeep ----------------------------------------------------------------------------


def test_compact_reduces_file_count_and_keeps_data(lake):
    expected = build_fragmented(lake)
    before = lake.file_stats(SPEC.name)
    assert before.num_rows == 12  # 6 appends x 2 org partitions
    metrics = lake.compact(SPEC.name)
    assert metrics["numFilesRemoved"] == 12
    after = lake.file_stats(SPEC.name)
    assert after.num_rows == 2  # one file per partition
    assert after.num_rows < before.num_rows
    assert pc.sum(after["num_records"]).as_py() == 36
    assert sorted_rows(lake.read(SPEC.name)) == expected


def test_compact_with_partition_filter_only_touches_that_partition(lake):
    expected = build_fragmented(lake)
    lake.compact(SPEC.name, partition_filters=[("org_id", "=", "a")])
    stats = lake.file_stats(SPEC.name).to_pylist()
    per_org = {}
    for s in stats:
        per_org[s["partition.org_id"]] = per_org.get(s["partition.org_id"], 0) + 1
    assert per_org == {"a": 1, "b": 6}
    assert sorted_rows(lake.read(SPEC.name)) == expected


def test_z_order_reduces_file_count_and_keeps_data(lake):
    expected = build_fragmented(lake)
    before = lake.file_stats(SPEC.name).num_rows
    metrics = lake.z_order(SPEC.name, ["engagement_date", "event_id"])
    assert metrics["numFilesRemoved"] == before
    after = lake.file_stats(SPEC.name)
    assert after.num_rows < before
    assert after.num_rows == 2
    assert sorted_rows(lake.read(SPEC.name)) == expected
    # Compacting an already z-ordered table changes nothing.
    lake.compact(SPEC.name)
    assert lake.file_stats(SPEC.name).num_rows == 2
    assert sorted_rows(lake.read(SPEC.name)) == expected


def test_vacuum_dry_run_lists_files_removed_by_compaction(lake):
    expected = build_fragmented(lake)
    old_paths = set(lake.file_stats(SPEC.name)["path"].to_pylist())
    lake.compact(SPEC.name)
    new_paths = set(lake.file_stats(SPEC.name)["path"].to_pylist())
    assert not (old_paths & new_paths)

    # With the default retention (>= 168 h) nothing recent is eligible.
    assert lake.vacuum(SPEC.name, retention_hours=168, dry_run=True) == []

    listed = lake.vacuum(SPEC.name, retention_hours=0, dry_run=True)
    assert set(listed) == old_paths
    root = lake.uri(SPEC.name)
    assert all(os.path.exists(os.path.join(root, p)) for p in listed)  # dry run deletes nothing

    deleted = lake.vacuum(SPEC.name, retention_hours=0)
    assert set(deleted) == old_paths
    assert not any(os.path.exists(os.path.join(root, p)) for p in deleted)
    assert all(os.path.exists(os.path.join(root, p)) for p in new_paths)
    assert sorted_rows(lake.read(SPEC.name)) == expected


def test_vacuum_below_a_week_does_not_raise(lake):
    build_fragmented(lake, appends=2)
    # Retention checks are off below 168 h (otherwise delta-rs refuses retention_hours=1).
    assert lake.vacuum(SPEC.name, retention_hours=1, dry_run=True) == []


# ---- reads / data skipping --------------------------------------------------------------------


def test_file_stats_have_min_max_only_for_stats_columns(lake):
    lake.append(SPEC, rows([("a", "e1", D0, 1), ("a", "e5", D0 + timedelta(days=4), 2)]), BatchTxn("w", 1))
    stats = lake.file_stats(SPEC.name)
    names = stats.schema.names
    assert "min.engagement_date" in names and "max.engagement_date" in names
    assert "min.event_id" in names
    assert "min.payload" not in names and "max.payload" not in names
    assert "min.amount" not in names
    row = stats.to_pylist()[0]
    assert row["min.engagement_date"] == D0
    assert row["max.engagement_date"] == D0 + timedelta(days=4)
    assert row["partition.org_id"] == "a"
    assert row["num_records"] == 2


def test_read_with_date_filter_returns_only_matching_rows(lake):
    # One append per day so each file covers one date (skippable by min/max).
    all_rows = []
    for i in range(5):
        batch = [(org, f"{org}-{i}", D0 + timedelta(days=i), i) for org in ("a", "b")]
        lake.append(SPEC, rows(batch), BatchTxn("w", i + 1))
        all_rows += batch
    target = D0 + timedelta(days=2)
    out = lake.read(SPEC.name, filters=[("engagement_date", "=", target)])
    assert sorted(out["event_id"].to_pylist()) == ["a-2", "b-2"]

    out = lake.read(SPEC.name, filters=[("org_id", "=", "a"), ("engagement_date", ">=", D0 + timedelta(days=3))])
    assert sorted(out["event_id"].to_pylist()) == ["a-3", "a-4"]

    out = lake.read(SPEC.name, filters=[("engagement_date", "<", D0 + timedelta(days=1))], columns=["event_id"])
    assert out.schema.names == ["event_id"]
    assert sorted(out["event_id"].to_pylist()) == ["a-0", "b-0"]

    out = lake.read(SPEC.name, filters=[("event_id", "in", ["a-1", "b-4", "zzz"])])
    assert sorted(out["event_id"].to_pylist()) == ["a-1", "b-4"]

    out = lake.read(SPEC.name, filters=[("engagement_date", "!=", target), ("amount", "<=", 1)])
    assert sorted(out["event_id"].to_pylist()) == ["a-0", "a-1", "b-0", "b-1"]

    out = lake.read(SPEC.name, filters=[("engagement_date", ">", D0 + timedelta(days=10))])
    assert out.num_rows == 0


# ---- sql_literal --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, literal",
    [
        ("abc", "'abc'"),
        ("", "''"),
        ("o'brien", "'o''brien'"),
        ("''", "''''''"),
        ("a' OR '1'='1", "'a'' OR ''1''=''1'"),
        (42, "'42'"),
    ],
)
def test_sql_literal_escapes_quotes(value, literal):
    assert sql_literal(value) == literal


def test_sql_literal_injection_is_inert(lake):
    lake.append(SPEC, rows([("a", "e1", D0, 1), ("b", "e2", D0, 2)]), BatchTxn("w", 1))
    hostile = "a' OR '1'='1"
    result = lake.delete(SPEC, "org_id = " + sql_literal(hostile), BatchTxn("d", 1))
    assert result["num_deleted_rows"] == 0
    assert count(lake) == 2


def test_filters_on_a_string_column_read_the_files_a_delete_rewrote(tmp_path):
    """delta-rs's DELETE writes the rows it keeps back with string_view columns, which pyarrow's comparison kernels
    refuse (a profile erasure reading such a quarantine file fails); read() compares a string
    column that is not a partition column as text_column, so every file reads."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from engagement_platform.lake.delta import text_column

    lake = DeltaLake(str(tmp_path))
    lake.append(SPEC, rows([("o1", "e1", D0, 1), ("o1", "e2", D0, 2), ("o1", "e3", D0, 3)]), BatchTxn("t", 1))
    lake.delete(SPEC, "event_id = 'e2'", BatchTxn("t", 2))
    assert {pq.read_schema(u).field("event_id").type for u in lake.table("events").file_uris()} == {pa.string_view()}
    with pytest.raises(pa.ArrowNotImplementedError):
        lake.table("events").to_pyarrow_dataset().to_table(filter=ds.field("event_id").isin(["e1"]))
    assert sorted(lake.read("events", filters=[("event_id", "in", ["e1", "e3"])])["amount"].to_pylist()) == [1, 3]
    assert lake.read("events", filters=[("event_id", "=", "e3"), ("org_id", "=", "o1")])["amount"].to_pylist() == [3]
    assert lake.table("events").to_pyarrow_dataset().to_table(filter=text_column("event_id") == "e1")[
        "amount"
    ].to_pylist() == [1]
