"""Layout report and upkeep over real delta-rs tables on tmp_path; range_overlap against brute force."""

from __future__ import annotations

import os
import random
from datetime import date, timedelta

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec
from engagement_platform.lake.layout import UPKEEP_APP_ID, needs_upkeep, partition_layout, range_overlap, upkeep

SPEC = TableSpec(
    name="activity",
    schema=pa.schema(
        [
            ("org_id", pa.string()),
            ("engagement_id", pa.string()),
            ("engagement_date", pa.date32()),
            ("payload", pa.string()),
        ]
    ),
    partition_by=("org_id",),
    stats_columns=("engagement_date", "engagement_id"),
    target_file_size=4 * 1024 * 1024,
)
D0 = date(2026, 1, 1)


def brute_force(intervals: list[tuple[int, int]]) -> tuple[float, int]:
    """Overlap by counting unit steps [d, d+1] inside each span, depth by counting ranges per day."""
    if not intervals:
        return 0.0, 0
    days = range(min(lo for lo, _ in intervals), max(hi for _, hi in intervals) + 1)
    steps = [sum(lo <= d < hi for lo, hi in intervals) for d in days]
    total, union = sum(steps), sum(c > 0 for c in steps)
    depth = max(sum(lo <= d <= hi for lo, hi in intervals) for d in days)
    return ((total - union) / total if total else 0.0), depth


interval = st.tuples(st.integers(-30, 60), st.integers(0, 25)).map(lambda t: (t[0], t[0] + t[1]))


@given(st.lists(interval, max_size=12))
def test_range_overlap_equals_brute_force_day_count(intervals):
    ratio, depth = range_overlap(intervals)
    want_ratio, want_depth = brute_force(intervals)
    assert ratio == pytest.approx(want_ratio)
    assert depth == want_depth
    assert 0.0 <= ratio < 1.0
    assert range_overlap(list(reversed(intervals))) == (ratio, depth)


@pytest.mark.parametrize(
    "intervals, ratio, depth",
    [
        ([], 0.0, 0),
        ([(0, 9)], 0.0, 1),
        ([(0, 4), (10, 14)], 0.0, 1),  # apart
        ([(0, 5), (5, 9)], 0.0, 2),  # touching at a boundary day: a sorted split, no overlap
        ([(0, 9), (0, 9), (0, 9), (0, 9)], 0.75, 4),  # identical spans: (n - 1) / n
        ([(0, 10), (5, 15)], 5 / 20, 2),
        ([(0, 20), (5, 10)], 5 / 25, 2),  # nested
        ([(3, 3), (3, 3)], 0.0, 2),  # single-day files: no span, but a one-day query reads both
    ],
)
def test_range_overlap_examples(intervals, ratio, depth):
    assert range_overlap(intervals) == (pytest.approx(ratio), depth)


def test_range_overlap_rejects_reversed_range():
    with pytest.raises(ValueError):
        range_overlap([(5, 1)])


# ---- tables --------------------------------------------------------------------------------------


def activity_rows(org: str, append: int, dates: list[date]) -> pa.Table:
    rng = random.Random(f"{org}-{append}")  # incompressible payloads, so files have a real size
    return pa.Table.from_pylist(
        [
            dict(
                org_id=org,
                engagement_id=f"{org}-{append}-{i}",
                engagement_date=d,
                payload=f'{{"n":{i},"pad":"{rng.randbytes(24).hex()}"}}',
            )
            for i, d in enumerate(dates)
        ],
        schema=SPEC.schema,
    )


def build_interleaved(lake: DeltaLake, appends: int = 10, rows_per_org: int = 60, seed: int = 3) -> None:
    """Like the ingestion stream: every append brings each org a file of rows spread over 60 days.
    Org "c" is the exception: one date per append, so its files never overlap."""
    rng = random.Random(seed)
    for i in range(appends):
        parts = [
            activity_rows(org, i, [D0 + timedelta(days=rng.randint(0, 59)) for _ in range(rows_per_org)])
            for org in ("a", "b")
        ]
        parts.append(activity_rows("c", i, [D0 + timedelta(days=i)] * 5))
        lake.append(SPEC, pa.concat_tables(parts), BatchTxn("ingest", i + 1))


def contents(lake: DeltaLake) -> list[dict]:
    return sorted(lake.read(SPEC.name).to_pylist(), key=lambda r: (r["org_id"], r["engagement_id"]))


def by_org(layout: pa.Table) -> dict[str, dict]:
    return {r["org_id"]: r for r in layout.to_pylist()}


def test_partition_layout_reports_files_sizes_and_overlap_per_org(lake):
    build_interleaved(lake, appends=10)
    layout = partition_layout(lake, SPEC.name)
    orgs = by_org(layout)
    assert set(orgs) == {"a", "b", "c"}
    files = lake.file_stats(SPEC.name)
    for org, r in orgs.items():
        mine = [f for f in files.to_pylist() if f["partition.org_id"] == org]
        assert r["files"] == len(mine) == 10
        assert r["total_bytes"] == sum(f["size_bytes"] for f in mine)
        assert r["mean_file_bytes"] == pytest.approx(r["total_bytes"] / 10)
        assert r["small_files"] == 10  # all far below half of the 4 MB target
        assert r["files_without_stats"] == 0
    assert orgs["a"]["rows"] == orgs["b"]["rows"] == 600 and orgs["c"]["rows"] == 50
    # Interleaved dates: every file spans most of the 60 days.
    assert orgs["a"]["overlap_ratio"] > 0.8 and orgs["a"]["max_depth"] == 10
    assert orgs["c"] == {
        **orgs["c"],
        "overlap_ratio": 0.0,
        "max_depth": 1,
        "range_min": D0,
        "range_max": D0 + timedelta(days=9),
    }
    data = lake.read(SPEC.name, filters=[("org_id", "=", "a")])["engagement_date"].to_pylist()
    assert (orgs["a"]["range_min"], orgs["a"]["range_max"]) == (min(data), max(data))
    assert layout["org_id"].to_pylist()[-1] == "c"  # worst overlap first
    assert set(needs_upkeep(layout, max_overlap_ratio=0.1)) == {"a", "b", "c"}  # c: small files


def test_partition_layout_of_an_absent_or_empty_table_is_empty(lake):
    assert partition_layout(lake, "nope").num_rows == 0
    lake.ensure(SPEC)
    layout = partition_layout(lake, SPEC.name)
    assert layout.num_rows == 0 and "overlap_ratio" in layout.schema.names


def test_upkeep_compacts_keeps_every_row_and_removes_overlap(lake):
    build_interleaved(lake, appends=12, rows_per_org=500)
    expected = contents(lake)
    before = by_org(partition_layout(lake, SPEC.name))

    result = upkeep(lake, SPEC, target_file_bytes=64 * 1024, vacuum_retention_hours=168)

    assert contents(lake) == expected
    after = by_org(partition_layout(lake, SPEC.name, small_file_bytes=32 * 1024))
    assert result["files_before"] == 36 and result["files_after"] == sum(r["files"] for r in after.values())
    assert result["files_after"] < result["files_before"]
    assert sorted(result["partitions_compacted"]) == ["a", "b", "c"] and result["partitions_conflicted"] == []
    assert result["partitions_unsettled"] == []
    assert result["files_removed"] == 36 and result["files_added"] == result["files_after"]
    for org in "abc":
        assert after[org]["files"] < before[org]["files"]
        assert after[org]["overlap_ratio"] == 0.0  # date-sorted: neighbours share at most a boundary day
        assert after[org]["max_depth"] <= 2
        assert after[org]["small_files"] <= 1
    assert after["a"]["files"] > 1  # 64 KB target: several files, still non-overlapping
    commits = lake.table(SPEC.name).history(result["version_after"] - result["version_before"])
    assert [(c["operation"], c["app_id"]) for c in commits] == [("OPTIMIZE", UPKEEP_APP_ID)] * 3  # one per partition
    assert result["files_vacuumed"] == 0  # within the retention nothing is deleted

    # Nothing written since: a second run rewrites nothing.
    again = upkeep(lake, SPEC, target_file_bytes=64 * 1024)
    assert again["partitions_compacted"] == [] and again["files_after"] == result["files_after"]
    assert contents(lake) == expected


def test_rewritten_files_reach_the_target_size_so_the_next_run_leaves_them(lake):
    # Compressible rows at a target below one default row group: without bounded row groups delta-rs
    # closes files at target / compression ratio (~0.4 here), "small" again on every run.
    build_interleaved(lake, appends=8, rows_per_org=3000)
    target = 256 * 1024
    first = upkeep(lake, SPEC, target_file_bytes=target)
    assert sorted(first["partitions_compacted"]) == ["a", "b", "c"] and first["partitions_unsettled"] == []
    sizes = sorted(f["size_bytes"] for f in lake.file_stats(SPEC.name).to_pylist() if f["partition.org_id"] == "a")
    assert len(sizes) > 2 and all(size >= target // 2 for size in sizes[1:])
    second = upkeep(lake, SPEC, target_file_bytes=target)
    assert second["partitions_compacted"] == [] and second["version_after"] == second["version_before"]


def test_upkeep_only_touches_the_given_partitions(lake):
    build_interleaved(lake, appends=4)
    expected = contents(lake)
    result = upkeep(lake, SPEC, partitions=["b"], target_file_bytes=1024 * 1024)
    assert result["partitions_compacted"] == ["b"]
    files = by_org(result["layout_after"])
    assert (files["a"]["files"], files["b"]["files"], files["c"]["files"]) == (4, 1, 4)
    assert contents(lake) == expected


def test_vacuum_dry_run_lists_the_compacted_files_and_deletes_nothing(lake):
    build_interleaved(lake, appends=5)
    expected = contents(lake)
    root = lake.uri(SPEC.name)
    old = set(lake.file_stats(SPEC.name)["path"].to_pylist())

    result = upkeep(lake, SPEC, target_file_bytes=1024 * 1024, vacuum_retention_hours=0, vacuum_dry_run=True)
    listed = {os.path.relpath(p, root) if os.path.isabs(p) else p for p in result["vacuumed_paths"]}
    assert listed == old and result["files_vacuumed"] == len(old) == 15
    assert all(os.path.exists(os.path.join(root, p)) for p in old)

    result = upkeep(lake, SPEC, target_file_bytes=1024 * 1024, vacuum_retention_hours=0)
    assert result["partitions_compacted"] == []
    assert not any(os.path.exists(os.path.join(root, p)) for p in old)
    assert contents(lake) == expected


class ConcurrentWriterLake(DeltaLake):
    """Commits `write` through another handle right after upkeep has loaded its snapshot."""

    def __init__(self, root: str, write):
        super().__init__(root)
        self.write = write

    def ensure(self, spec):
        table = super().ensure(spec)
        self.write(DeltaLake(self.root))
        self.write = lambda _: None
        return table


def test_a_concurrent_delete_is_a_reported_conflict_that_loses_nothing(lake_root, lake):
    build_interleaved(lake, appends=6)
    racing = ConcurrentWriterLake(
        lake_root, lambda other: other.delete(SPEC, "engagement_id = 'b-0-0'", BatchTxn("gdpr", 1))
    )
    expected = [r for r in contents(lake) if r["engagement_id"] != "b-0-0"]
    first = partition_layout(lake, SPEC.name)["org_id"][0].as_py()  # upkeep works worst-first

    result = upkeep(racing, SPEC, target_file_bytes=1024 * 1024)

    # delta-rs fails an optimize on any concurrent file removal; only the partition in flight is lost.
    assert result["partitions_conflicted"] == [first]
    assert sorted(result["partitions_compacted"] + [first]) == ["a", "b", "c"]
    assert contents(lake) == expected
    assert by_org(result["layout_after"])[first]["files"] >= 6

    retry = upkeep(lake, SPEC, target_file_bytes=1024 * 1024)
    assert retry["partitions_compacted"] == [first] and retry["partitions_conflicted"] == []
    assert contents(lake) == expected


def test_a_concurrent_append_does_not_conflict_and_is_kept(lake_root, lake):
    build_interleaved(lake, appends=6)
    late = activity_rows("a", 99, [D0] * 3)
    racing = ConcurrentWriterLake(lake_root, lambda other: other.append(SPEC, late, BatchTxn("ingest", 99)))
    expected = sorted(contents(lake) + late.to_pylist(), key=lambda r: (r["org_id"], r["engagement_id"]))

    result = upkeep(racing, SPEC, target_file_bytes=1024 * 1024)

    assert result["partitions_conflicted"] == [] and len(result["partitions_compacted"]) == 3
    assert contents(lake) == expected
