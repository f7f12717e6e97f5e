"""Batch planning: unit tests and property tests (hypothesis) of plan_next_batch, offset_gaps_and_overlaps and
the typed slices' checkpoint row format."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import (
    BatchPlan,
    FileSetSlice,
    FileSlice,
    KafkaSlice,
    SnapshotSlice,
    TableVersionsSlice,
    offset_gaps_and_overlaps,
    plan_next_batch,
)
from engagement_platform.streams.slices import from_columns, to_columns

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def plan(batch_id: int, *ranges: tuple[int, int, int], stream: str = "s", topic: str = "t") -> BatchPlan:
    return BatchPlan(stream, batch_id, KafkaSlice(topic, tuple(OffsetRange(p, a, b) for p, a, b in ranges)))


# ---- unit tests -------------------------------------------------------------------------------


def test_first_plan_starts_at_low_watermarks_and_is_bounded():
    p = plan_next_batch("s", "t", None, {1: (5, 100), 0: (0, 3), 2: (7, 7)}, 10)
    assert p == BatchPlan("s", 1, KafkaSlice("t", (OffsetRange(0, 0, 3), OffsetRange(1, 5, 15), OffsetRange(2, 7, 7))))
    assert p.record_count == 13
    assert p.ends() == {0: 3, 1: 15, 2: 7}


def test_next_plan_continues_from_previous_ends():
    p1 = plan_next_batch("s", "t", None, {0: (0, 25), 1: (0, 4)}, 10)
    p2 = plan_next_batch("s", "t", p1, {0: (0, 25), 1: (0, 4)}, 10)
    p3 = plan_next_batch("s", "t", p2, {0: (0, 25), 1: (0, 4)}, 10)
    assert [r for r in p2.ranges] == [OffsetRange(0, 10, 20), OffsetRange(1, 4, 4)]
    assert [r for r in p3.ranges] == [OffsetRange(0, 20, 25), OffsetRange(1, 4, 4)]
    assert [p.batch_id for p in (p1, p2, p3)] == [1, 2, 3]
    assert plan_next_batch("s", "t", p3, {0: (0, 25), 1: (0, 4)}, 10) is None
    assert offset_gaps_and_overlaps([p3, p1, p2]) == (0, 0)


def test_none_when_nothing_new():
    assert plan_next_batch("s", "t", None, {}, 10) is None
    assert plan_next_batch("s", "t", None, {0: (0, 0), 1: (9, 9)}, 10) is None
    prev = plan(4, (0, 0, 50), (1, 3, 8))
    assert plan_next_batch("s", "t", prev, {0: (0, 50), 1: (0, 8)}, 10) is None
    # High watermark below the previous end (e.g. a lagging replica): nothing, not a rewind.
    assert plan_next_batch("s", "t", prev, {0: (0, 40), 1: (0, 8)}, 10) is None


def test_low_watermark_past_previous_end_skips_deleted_offsets():
    prev = plan(3, (0, 0, 10))
    nxt = plan_next_batch("s", "t", prev, {0: (30, 35)}, 10)
    assert nxt.ranges == (OffsetRange(0, 30, 35),)
    assert nxt.batch_id == 4
    assert offset_gaps_and_overlaps([prev, nxt]) == (20, 0)


def test_new_partition_starts_at_its_low_watermark():
    prev = plan(1, (0, 0, 10))
    nxt = plan_next_batch("s", "t", prev, {0: (0, 10), 1: (4, 6)}, 10)
    assert nxt.ranges == (OffsetRange(0, 10, 10), OffsetRange(1, 4, 6))


def test_max_records_must_be_positive():
    for bad in (0, -1):
        with pytest.raises(ValueError):
            plan_next_batch("s", "t", None, {0: (0, 10)}, bad)


def test_keys():
    p = plan(12, (0, 5, 9), (1, 0, 0), stream="engagement", topic="acts")
    assert p.partition_key == "00000012"
    assert p.run_key == "engagement/12/acts[0:5-9,1:0-0]"
    assert plan(12, (0, 5, 10), (1, 0, 0), stream="engagement", topic="acts").run_key != p.run_key
    assert plan(13, (0, 5, 9), (1, 0, 0), stream="engagement", topic="acts").run_key != p.run_key
    assert plan(12, (0, 5, 9), (1, 0, 0), stream="other", topic="acts").run_key != p.run_key
    assert sorted([plan(i).partition_key for i in (10, 9, 100, 1)]) == [plan(i).partition_key for i in (1, 9, 10, 100)]


def test_ranges_json_round_trip_unit():
    p = plan(1, (0, 5, 9), (3, 0, 0), (7, 123456789012, 123456789999))
    assert p.ranges_json() == "[[0, 5, 9], [3, 0, 0], [7, 123456789012, 123456789999]]"
    assert BatchPlan.ranges_from_json(p.ranges_json()) == p.ranges
    assert BatchPlan.ranges_from_json("[]") == ()


def test_gaps_and_overlaps_unit():
    assert offset_gaps_and_overlaps([]) == (0, 0)
    assert offset_gaps_and_overlaps([plan(1, (0, 0, 10))]) == (0, 0)
    assert offset_gaps_and_overlaps([plan(1, (0, 0, 10)), plan(2, (0, 12, 20))]) == (2, 0)
    assert offset_gaps_and_overlaps([plan(1, (0, 0, 10)), plan(2, (0, 7, 20))]) == (0, 3)
    # Per partition; order of the list does not matter (sorted by batch id).
    plans = [plan(2, (0, 10, 20), (1, 6, 9)), plan(1, (0, 0, 10), (1, 0, 5))]
    assert offset_gaps_and_overlaps(plans) == (1, 0)


# ---- property: repeated planning over growing watermarks ------------------------------------------


@st.composite
def watermark_histories(draw):
    """(max_records, steps): each step is {partition: (low, high)}, highs never decrease, lows rise sometimes."""
    n_partitions = draw(st.integers(1, 4))
    max_records = draw(st.integers(1, 8))
    n_steps = draw(st.integers(1, 6))
    rising_low = draw(st.booleans())
    low = {p: draw(st.integers(0, 5)) for p in range(n_partitions)}
    high = {p: low[p] + draw(st.integers(0, 10)) for p in range(n_partitions)}
    steps = []
    for _ in range(n_steps):
        for p in range(n_partitions):
            high[p] += draw(st.integers(0, 25))
            if rising_low and draw(st.booleans()):
                low[p] = min(high[p], low[p] + draw(st.integers(0, 30)))
        steps.append({p: (low[p], high[p]) for p in range(n_partitions)})
    return max_records, steps


@SETTINGS
@given(watermark_histories(), st.randoms(use_true_random=False))
def test_repeated_planning_is_contiguous_bounded_and_catches_up(history, rnd):
    max_records, steps = history
    previous: BatchPlan | None = None
    plans: list[BatchPlan] = []
    expected_gaps = 0
    for watermarks in steps:
        # How many batches this step must take: the slowest partition's backlog / max_records.
        ends = previous.ends() if previous else {}
        backlog = {p: hi - max(ends.get(p, lo), lo) for p, (lo, hi) in watermarks.items()}
        expected_batches = max([math.ceil(max(b, 0) / max_records) for b in backlog.values()] + [0])
        batches_this_step = 0
        while True:
            nxt = plan_next_batch("stream", "topic", previous, watermarks, max_records)
            if nxt is None:
                break
            batches_this_step += 1
            assert batches_this_step <= expected_batches, "planning does not converge"
            assert nxt.batch_id == len(plans) + 1
            assert nxt.stream == "stream" and nxt.topic == "topic"
            assert [r.partition for r in nxt.ranges] == sorted(watermarks)
            assert nxt.record_count > 0
            # Same inputs, same plan (a re-evaluated tick).
            assert plan_next_batch("stream", "topic", previous, watermarks, max_records) == nxt
            prev_ends = previous.ends() if previous else {}
            for r in nxt.ranges:
                lo, hi = watermarks[r.partition]
                assert 0 <= r.size <= max_records
                assert lo <= r.start <= r.end <= hi
                if r.partition in prev_ends:
                    assert r.start == max(prev_ends[r.partition], lo)
                    expected_gaps += max(lo - prev_ends[r.partition], 0)
                else:
                    assert r.start == lo
                # Takes as much as allowed.
                assert r.size == min(max_records, hi - r.start)
            plans.append(nxt)
            previous = nxt
        assert batches_this_step == expected_batches
        # Caught up: nothing left below any high watermark (offsets under the low watermark are gone).
        ends = previous.ends() if previous else {}
        for p, (lo, hi) in watermarks.items():
            assert max(ends.get(p, lo), lo) == hi

    gaps, overlaps = offset_gaps_and_overlaps(plans)
    assert overlaps == 0
    assert gaps == expected_gaps
    shuffled = plans[:]
    rnd.shuffle(shuffled)
    assert offset_gaps_and_overlaps(shuffled) == (gaps, overlaps)
    if expected_gaps == 0:
        assert (gaps, overlaps) == (0, 0)

    run_keys = [p.run_key for p in plans]
    assert len(set(run_keys)) == len(plans)
    keys = [p.partition_key for p in plans]
    assert len(set(keys)) == len(plans)
    assert sorted(keys) == keys  # zero padding: string order is batch order
    for p in plans:
        assert BatchPlan.ranges_from_json(p.ranges_json()) == p.ranges


@SETTINGS
@given(watermark_histories())
def test_no_gaps_when_low_watermark_never_passes_previous_end(history):
    max_records, steps = history
    # Keep only the lows that never pass what was already planned: fix them at the first step's lows.
    first_lows = {p: lo for p, (lo, _) in steps[0].items()}
    steps = [{p: (first_lows[p], max(hi, first_lows[p])) for p, (_, hi) in s.items()} for s in steps]
    previous, plans = None, []
    for watermarks in steps:
        while (nxt := plan_next_batch("s", "t", previous, watermarks, max_records)) is not None:
            plans.append(nxt)
            previous = nxt
    assert offset_gaps_and_overlaps(plans) == (0, 0)
    assert [p.batch_id for p in plans] == list(range(1, len(plans) + 1))
    # Every offset between the low and the last high is read exactly once.
    last = steps[-1]
    for part, (lo, hi) in last.items():
        offsets = [o for p in plans for r in p.ranges if r.partition == part for o in range(r.start, r.end)]
        assert offsets == list(range(lo, hi))


@SETTINGS
@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.integers(0, 10**12), st.integers(0, 10**6)),
        max_size=6,
    ),
    st.integers(1, 10**6),
    st.text(min_size=1, max_size=10),
    st.text(min_size=1, max_size=10),
)
def test_ranges_json_round_trip(raw, batch_id, stream, topic):
    ranges = tuple(OffsetRange(p, s, s + n) for p, s, n in raw)
    p = BatchPlan(stream, batch_id, KafkaSlice(topic, ranges))
    back = BatchPlan(stream, batch_id, KafkaSlice(topic, BatchPlan.ranges_from_json(p.ranges_json())))
    assert back == p
    assert back.run_key == p.run_key
    assert back.partition_key == p.partition_key == f"{batch_id:08d}"
    assert back.record_count == sum(n for _, _, n in raw)


# ---- property: offset_gaps_and_overlaps against a reference on sets of offsets ------------------


def reference_gaps_and_overlaps(plans: list[BatchPlan]) -> tuple[int, int]:
    """Slow and obvious: per partition, the set of offsets read so far.

    overlaps: offsets a range reads that an earlier batch already read.
    gaps: offsets between a partition's first start and its furthest end that no batch read.
    """
    read: dict[int, set[int]] = {}
    first: dict[int, int] = {}
    furthest: dict[int, int] = {}
    overlaps = 0
    for p in sorted(plans, key=lambda p: p.batch_id):
        for r in p.ranges:
            offsets = set(range(r.start, r.end))
            seen = read.setdefault(r.partition, set())
            overlaps += len(offsets & seen)
            seen |= offsets
            first.setdefault(r.partition, r.start)
            furthest[r.partition] = max(furthest.get(r.partition, r.end), r.end)
    gaps = sum(len(set(range(first[k], furthest[k])) - read[k]) for k in read)
    return gaps, overlaps


@st.composite
def hand_built_plans(draw, mode: str):
    """Plans of one stream built directly (not by plan_next_batch).

    forward: each range starts at or after the partition's furthest end so far (gaps, no re-reads).
    rewind:  each range starts at or before that end (re-reads, no gaps) and ends at or after it.
    """
    partitions = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True))
    n = draw(st.integers(1, 6))
    furthest: dict[int, int] = {}
    first_start: dict[int, int] = {}
    plans = []
    for batch_id in range(1, n + 1):
        ranges = []
        for part in sorted(draw(st.lists(st.sampled_from(partitions), min_size=1, unique=True))):
            last = furthest.get(part)
            if last is None:
                start = draw(st.integers(0, 20))
                end = start + draw(st.integers(0, 10))
            elif mode == "forward":
                start = last + draw(st.integers(0, 10))
                end = start + draw(st.integers(0, 10))
            else:
                start = draw(st.integers(first_start[part], last))
                end = last + draw(st.integers(0, 10))
            if last is None:
                first_start[part] = start
            furthest[part] = max(last if last is not None else end, end)
            ranges.append(OffsetRange(part, start, end))
        plans.append(BatchPlan("s", batch_id, KafkaSlice("t", tuple(ranges))))
    return plans


@SETTINGS
@given(hand_built_plans("forward"), st.randoms(use_true_random=False))
def test_gaps_match_reference_for_forward_plans(plans, rnd):
    expected = reference_gaps_and_overlaps(plans)
    assert expected[1] == 0
    rnd.shuffle(plans)
    assert offset_gaps_and_overlaps(plans) == expected


@SETTINGS
@given(hand_built_plans("rewind"), st.randoms(use_true_random=False))
def test_overlaps_match_reference_for_rewinding_plans(plans, rnd):
    expected = reference_gaps_and_overlaps(plans)
    assert expected[0] == 0
    rnd.shuffle(plans)
    assert offset_gaps_and_overlaps(plans) == expected


def test_reference_agrees_with_plan_next_batch_history():
    rnd = random.Random(7)
    previous, plans = None, []
    low = {0: 0, 1: 0, 2: 0}
    high = {0: 0, 1: 0, 2: 0}
    for _ in range(30):
        for p in high:
            high[p] += rnd.randint(0, 15)
            if rnd.random() < 0.2:
                low[p] = min(high[p], low[p] + rnd.randint(0, 40))
        nxt = plan_next_batch("s", "t", previous, {p: (low[p], high[p]) for p in high}, 6)
        if nxt:
            plans.append(nxt)
            previous = nxt
    assert len(plans) > 10
    assert offset_gaps_and_overlaps(plans) == reference_gaps_and_overlaps(plans)


@pytest.mark.parametrize(
    "plans",
    [
        # [0,10) then [5,7): offsets 5 and 6 read twice (2), reported 5.
        [plan(1, (0, 0, 10)), plan(2, (0, 5, 7))],
        # [0,10), [15,20), then [10,15): every offset read once, reported gaps=5 and overlaps=10.
        [plan(1, (0, 0, 10)), plan(2, (0, 15, 20)), plan(3, (0, 10, 15))],
        # An empty range ahead of the end, then the next batch resumes at the end: nothing skipped or re-read.
        [plan(1, (0, 0, 10)), plan(2, (0, 12, 12)), plan(3, (0, 10, 20))],
    ],
    ids=["range-inside-read-span", "gap-filled-later", "empty-range-ahead"],
)
def test_gaps_and_overlaps_non_monotone_plans_match_reference(plans):
    assert offset_gaps_and_overlaps(plans) == reference_gaps_and_overlaps(plans)


# ---- typed slices: every kind through the checkpoint row format ----------------------------------

names = st.text(min_size=1, max_size=30)
kafka_slices = st.builds(
    KafkaSlice,
    names,
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10**12), st.integers(0, 10**6)), max_size=6).map(
        lambda raw: tuple(OffsetRange(p, s, s + n) for p, s, n in raw)
    ),
)
file_slices = st.builds(FileSlice, names, st.integers(0, 10**12))
version_slices = st.tuples(names, st.integers(-1, 10**6), st.integers(0, 10**6)).map(
    lambda t: TableVersionsSlice(t[0], t[1], t[1] + t[2])
)
snapshot_slices = st.builds(
    SnapshotSlice,
    names,
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
    st.lists(st.tuples(names, st.integers(0, 10**12), st.none() | st.integers(0, 2**62)), max_size=5).map(tuple),
)
file_set_slices = st.lists(file_slices, min_size=1, max_size=5, unique_by=lambda f: f.path).map(
    lambda files: FileSetSlice(tuple(files))
)
any_slice = st.one_of(kafka_slices, file_slices, file_set_slices, version_slices, snapshot_slices)


@SETTINGS
@given(any_slice, st.integers(1, 10**6), names)
def test_every_slice_kind_round_trips_through_the_checkpoint_columns(slice_, batch_id, stream):
    topic, ranges = to_columns(slice_)
    assert isinstance(topic, str) and isinstance(ranges, str)
    back = from_columns(topic, ranges)
    assert back == slice_ and type(back) is type(slice_)
    p, q = BatchPlan(stream, batch_id, slice_), BatchPlan(stream, batch_id, back)
    assert q == p and q.run_key == p.run_key and q.record_count == p.record_count
    assert p.run_key.startswith(f"{stream}/{batch_id}/")


@SETTINGS
@given(kafka_slices)
def test_kafka_slices_keep_the_original_row_format(slice_):
    topic, ranges = to_columns(slice_)
    assert topic == slice_.topic
    assert json.loads(ranges) == [[r.partition, r.start, r.end] for r in slice_.ranges]
    assert BatchPlan("s", 1, slice_).ranges_json() == ranges


def test_rows_in_the_old_format_read_back_as_kafka_slices():
    assert from_columns("t.activities", "[[0, 0, 10], [1, 5, 9]]") == KafkaSlice(
        "t.activities", (OffsetRange(0, 0, 10), OffsetRange(1, 5, 9))
    )
    assert from_columns("t", "[]") == KafkaSlice("t", ())
    # Landing files and processor versions stored as offsets before the typed slices are read as the kind asked for.
    old_file = BatchPlan("ingest.rewards", 3, from_columns("/landing/a.csv", "[[0, 0, 1234]]"))
    assert old_file.slice_as(FileSlice) == FileSlice("/landing/a.csv", 1234)
    old_versions = BatchPlan("profile_processor/acme", 2, from_columns("profile_cdc_staging", "[[0, 5, 9]]"))
    assert old_versions.slice_as(TableVersionsSlice) == TableVersionsSlice("profile_cdc_staging", 4, 8)
    with pytest.raises(TypeError):
        BatchPlan("s", 1, KafkaSlice("t", (OffsetRange(0, 0, 3), OffsetRange(1, 0, 3)))).slice_as(FileSlice)
    with pytest.raises(ValueError, match="unknown slice kind"):
        from_columns("x", '{"kind": "tape"}')


def test_landing_plans_of_one_file_read_back_as_file_sets():
    """Landing plans stored before batches of files (a FileSlice, or offsets before that) are one-file sets."""
    one = FileSlice("/landing/a.csv", 1234)
    assert BatchPlan("ingest.rewards", 3, one).slice_as(FileSetSlice) == FileSetSlice((one,))
    old = BatchPlan("ingest.rewards", 3, from_columns("/landing/a.csv", "[[0, 0, 1234]]"))
    assert old.slice_as(FileSetSlice) == FileSetSlice((one,))
    with pytest.raises(TypeError):
        BatchPlan("s", 1, TableVersionsSlice("t", 1, 2)).slice_as(FileSetSlice)
    with pytest.raises(ValueError, match="at least one file"):
        FileSetSlice(())
    with pytest.raises(ValueError, match="names a file twice"):
        FileSetSlice((one, FileSlice("/landing/a.csv", 99)))


def test_a_file_set_names_its_files_folder_and_bytes():
    files = FileSetSlice((FileSlice("s3://b/landing/m/a.csv", 10), FileSlice("s3://b/landing/m/ab.csv", 5)))
    assert (files.source, files.size) == ("s3://b/landing/m/", 15)
    assert files.key == "s3://b/landing/m/a.csv..s3://b/landing/m/ab.csv[2 files, 15 bytes]"
    single = FileSetSlice((FileSlice("/landing/a.csv", 7),))
    assert (single.source, single.key) == ("/landing/a.csv", FileSlice("/landing/a.csv", 7).key)
    assert to_columns(files) == (
        "s3://b/landing/m/",
        json.dumps({"kind": "files", "files": [["s3://b/landing/m/a.csv", 10], ["s3://b/landing/m/ab.csv", 5]]}),
    )


def test_slice_keys_and_kafka_conveniences():
    until = datetime(2026, 1, 5, 10, tzinfo=UTC)
    file_plan = BatchPlan("ingest.rewards", 7, FileSlice("/landing/a.csv", 1234))
    versions = BatchPlan("profile_processor/acme", 2, TableVersionsSlice("profile_cdc_staging", 4, 9))
    snapshot = BatchPlan(
        "profile_backfill/acme", 1, SnapshotSlice("/exports/acme", until, (("a.jsonl", 10, None), ("b.parquet", 20, 5)))
    )
    assert file_plan.run_key == "ingest.rewards/7//landing/a.csv[1234 bytes]"
    assert versions.run_key == "profile_processor/acme/2/profile_cdc_staging(4..9]"
    assert (
        snapshot.run_key == "profile_backfill/acme/1//exports/acme?until=2026-01-05T10:00:00+00:00[2 files, 30 bytes]"
    )
    assert [p.record_count for p in (file_plan, versions, snapshot)] == [0, 0, 0]
    assert file_plan.slice_as(FileSlice) is file_plan.slice
    for p in (file_plan, versions, snapshot):
        for read in (lambda: p.topic, lambda: p.ranges, p.ranges_json, p.ends):
            with pytest.raises(TypeError, match="not Kafka offsets"):
                read()
        with pytest.raises(TypeError):
            p.slice_as(KafkaSlice)
    # A snapshot boundary an hour later is another slice.
    assert snapshot.slice != SnapshotSlice("/exports/acme", until + timedelta(hours=1), snapshot.slice.files)


def test_a_snapshot_export_is_the_same_when_path_boundary_names_sizes_and_known_times_match():
    until = datetime(2026, 1, 5, 12, tzinfo=UTC)
    export = SnapshotSlice("/exports/a", until, (("part-0.jsonl", 10, 111), ("part-1.parquet", 20, 222)))
    assert export.same_export(
        SnapshotSlice("/exports/a", until, (("part-0.jsonl", 10, 111), ("part-1.parquet", 20, 222)))
    )
    # a plan stored before modification times were recorded: names and sizes decide
    stored = from_columns(
        "/exports/a",
        json.dumps(
            {
                "kind": "snapshot",
                "path": "/exports/a",
                "until": until.isoformat(),
                "files": [["part-0.jsonl", 10], ["part-1.parquet", 20]],
            }
        ),
    )
    assert stored.files == (("part-0.jsonl", 10, None), ("part-1.parquet", 20, None)) and stored.same_export(export)
    rewritten = SnapshotSlice("/exports/a", until, (("part-0.jsonl", 10, 999), ("part-1.parquet", 20, 222)))
    assert not export.same_export(rewritten), "a file rewritten in place (same size) is another export"
    assert not export.same_export(
        SnapshotSlice("/exports/a", until, (("part-0.jsonl", 11, 111), ("part-1.parquet", 20, 222)))
    )
    assert not export.same_export(SnapshotSlice("/exports/b", until, export.files))
    assert not export.same_export(SnapshotSlice("/exports/a", until.replace(hour=13), export.files))
    assert not export.same_export(SnapshotSlice("/exports/a", until, export.files[:1]))
