"""Files written outside delta-rs (as Spark tasks do) and committed by one driver commit: readable, counted
once, skippable by their statistics, invisible until committed, and cleaned up when never committed."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.file_stats import MAX_STAT_CHARS, delta_stats, partition_stats
from engagement_platform.lake.file_writes import (
    HIVE_NULL,
    commit_files,
    delete_uncommitted,
    rewrite_files,
    unreferenced_files,
    write_files,
    writer_tag,
)
from engagement_platform_tests.support.files import SPEC, T0, rows


@pytest.fixture
def lake(tmp_path) -> DeltaLake:
    return DeltaLake(str(tmp_path / "lake"))


def test_one_commit_holds_every_file_of_the_batch_once(lake):
    batch = rows(["a", "b", "a", "c"])
    files = write_files(lake.uri(SPEC.name), SPEC, batch, writer_tag("app", 1))
    assert sorted(f.partition_values["org_id"] for f in files) == ["a", "b", "c"]
    assert not lake.exists(SPEC.name), "files alone are no table: nothing is visible before the commit"
    version = commit_files(lake, SPEC, files, BatchTxn("app", 1))
    assert version is not None and lake.committed_version(SPEC.name, "app") == 1
    assert sorted(lake.read(SPEC.name)["event_id"].to_pylist()) == sorted(batch["event_id"].to_pylist())
    assert commit_files(lake, SPEC, files, BatchTxn("app", 1)) is None, "the batch is already there"
    assert lake.table(SPEC.name).version() == version
    changes = lake.table(SPEC.name).load_cdf(starting_version=version, ending_version=version).read_all()
    assert changes.num_rows == 4 and set(changes["_change_type"].to_pylist()) == {"insert"}


def test_statistics_let_a_reader_skip_files(lake):
    for batch_id, day in ((1, date(2026, 1, 1)), (2, date(2026, 2, 1))):
        files = write_files(
            lake.uri(SPEC.name), SPEC, rows(["a"] * 10, start=batch_id * 100, day=day), writer_tag("app", batch_id)
        )
        commit_files(lake, SPEC, files, BatchTxn("app", batch_id))
    dataset = lake.table(SPEC.name).to_pyarrow_dataset()
    assert len(list(dataset.get_fragments())) == 2
    assert len(list(dataset.get_fragments(filter=ds.field("day") == date(2026, 2, 1)))) == 1
    assert dataset.to_table(filter=ds.field("day") == date(2026, 2, 1)).num_rows == 10


def test_a_null_partition_value_round_trips(lake):
    files = write_files(lake.uri(SPEC.name), SPEC, rows([None, "a"]), writer_tag("app", 1))
    assert any(HIVE_NULL in f.path and f.partition_values == {"org_id": None} for f in files)
    commit_files(lake, SPEC, files, BatchTxn("app", 1))
    assert sorted(lake.read(SPEC.name)["org_id"].to_pylist(), key=str) == [None, "a"]


def test_files_never_committed_are_deleted_by_the_batchs_next_attempt_only(lake):
    committed = write_files(lake.uri(SPEC.name), SPEC, rows(["a"]), writer_tag("app", 1))
    commit_files(lake, SPEC, committed, BatchTxn("app", 1))
    dead = write_files(lake.uri(SPEC.name), SPEC, rows(["a", "b"], start=10), writer_tag("app", 2))
    other = write_files(lake.uri(SPEC.name), SPEC, rows(["a"], start=20), writer_tag("other", 2))
    assert len(unreferenced_files(lake, SPEC)) == 3
    assert delete_uncommitted(lake, SPEC, writer_tag("app", 2)) == 2
    assert unreferenced_files(lake, SPEC) == [other[0].path], "another writer's files are not this batch's to delete"
    assert delete_uncommitted(lake, SPEC, writer_tag("app", 1)) == 0, "committed files stay"
    assert lake.read(SPEC.name).num_rows == 1
    assert dead  # written, never visible


def test_rewriting_uncommitted_files_drops_the_rejected_rows(lake):
    tag = writer_tag("app", 1)
    files = write_files(lake.uri(SPEC.name), SPEC, rows(["a", "a", "b"]), tag)
    kept = rewrite_files(lake.uri(SPEC.name), SPEC, files, lambda t: pa.compute.not_equal(t["event_id"], "e00001"), tag)
    assert unreferenced_files(lake, SPEC) == sorted(f.path for f in kept), "the replaced files are gone"
    commit_files(lake, SPEC, kept, BatchTxn("app", 1))
    assert sorted(lake.read(SPEC.name)["event_id"].to_pylist()) == ["e00000", "e00002"]
    assert sum(json.loads(f.stats)["numRecords"] for f in kept) == 2


def test_statistics_format_dates_timestamps_and_leave_out_long_strings():
    table = pa.table(
        {
            "day": [date(2026, 1, 2), None],
            "at": [T0, T0 + timedelta(microseconds=1)],
            "s": ["b" * (MAX_STAT_CHARS + 1), "a"],
            "f": [float("nan"), 1.0],
        }
    )
    stats = json.loads(delta_stats(table, ["day", "at", "s", "f"]))
    assert stats["numRecords"] == 2 and stats["nullCount"] == {"day": 1, "at": 0, "s": 0, "f": 0}
    assert stats["minValues"]["day"] == stats["maxValues"]["day"] == "2026-01-02"
    assert stats["minValues"]["at"] == "2026-01-05T10:00:00.123Z"  # floored to the millisecond
    assert stats["maxValues"]["at"] == "2026-01-05T10:00:00.124Z"  # rounded up: the bound still covers the row
    assert "s" not in stats["minValues"] and "s" not in stats["maxValues"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-(10**12), 10**12),
            st.text(max_size=20),
            st.integers(0, 10**9).map(lambda us: T0 + timedelta(microseconds=us)),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_every_row_lies_within_its_files_bounds(values):
    """Against the obvious reference: each row compared with the bounds a reader would skip on."""
    ints, texts, stamps = (list(c) for c in zip(*values))
    table = pa.table(
        {
            "i": pa.array(ints, pa.int64()),
            "s": pa.array(texts, pa.string()),
            "t": pa.array(stamps, pa.timestamp("us", tz="UTC")),
        }
    )
    stats = json.loads(delta_stats(table, ["i", "s", "t"]))
    assert stats["minValues"]["i"] == min(ints) and stats["maxValues"]["i"] == max(ints)
    assert stats["minValues"]["s"] == min(texts) and stats["maxValues"]["s"] == max(texts)

    def parse(text: str) -> datetime:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)

    assert all(parse(stats["minValues"]["t"]) <= s <= parse(stats["maxValues"]["t"]) for s in stamps)
    assert parse(stats["maxValues"]["t"]) - max(stamps) < timedelta(milliseconds=1)


def stats_one_column_at_a_time(part: pa.Table, columns: list[str]) -> dict:
    """The slow, obvious statistics: each column of one partition's rows on its own."""
    import math

    import pyarrow.compute as pc

    mins, maxs, nulls = {}, {}, {}
    for name in columns:
        column = part[name]
        nulls[name] = column.null_count
        if column.null_count == len(column):
            continue
        low, high = pc.min_max(column)["min"].as_py(), pc.min_max(column)["max"].as_py()
        if isinstance(low, float) and (math.isnan(low) or math.isnan(high) or math.isinf(low) or math.isinf(high)):
            continue
        if isinstance(low, str) and (len(low) > MAX_STAT_CHARS or len(high) > MAX_STAT_CHARS):
            continue
        if isinstance(low, datetime):
            low = low.astimezone(UTC).replace(microsecond=low.microsecond // 1000 * 1000)
            up = high.astimezone(UTC)
            rounded = up.replace(microsecond=up.microsecond // 1000 * 1000)
            high = rounded + timedelta(milliseconds=1) if rounded != up else rounded
            low, high = (t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z" for t in (low, high))
        mins[name], maxs[name] = low, high
    return {"numRecords": part.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", None]),
            st.none() | st.integers(-5, 5),
            st.none() | st.floats(allow_nan=True, allow_infinity=True),
            st.none() | st.text(max_size=3),
            st.none() | st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1)),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_statistics_of_all_partitions_at_once_equal_each_partitions_own(values):
    org, n, x, s, t = zip(*values)
    table = pa.table(
        {
            "org": pa.array(org, pa.string()),
            "n": pa.array(n, pa.int64()),
            "x": pa.array(x, pa.float64()),
            "s": pa.array(s, pa.string()),
            "t": pa.array([v.replace(tzinfo=UTC) if v else None for v in t], pa.timestamp("us", tz="UTC")),
        }
    )
    columns = ["n", "x", "s", "t"]
    found = partition_stats(table, ["org"], columns)
    assert set(found) == {(o,) for o in org}
    for (key,), text in found.items():
        part = table.filter(pa.compute.is_null(table["org"]) if key is None else pa.compute.equal(table["org"], key))
        assert json.loads(text) == stats_one_column_at_a_time(part, columns)
    assert json.loads(delta_stats(table, columns)) == stats_one_column_at_a_time(table, columns)
