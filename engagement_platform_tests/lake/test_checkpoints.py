"""CheckpointStore on a real Delta table: plans stored once, states as an audit log, streams isolated,
every slice kind stored, many batches in one commit."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from engagement_platform.lake.checkpoints import BATCH, CHECKPOINTS, PLAN, ROW_ORDER
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import (
    BatchPlan,
    FileSetSlice,
    FileSlice,
    KafkaSlice,
    SnapshotSlice,
    TableVersionsSlice,
)


def make_plan(stream: str, batch_id: int, topic: str = "t.activities", base: int = 0) -> BatchPlan:
    return BatchPlan(
        stream,
        batch_id,
        KafkaSlice(
            topic,
            (
                OffsetRange(0, base + (batch_id - 1) * 10, base + batch_id * 10),
                OffsetRange(1, base + (batch_id - 1) * 5, base + batch_id * 5),
                OffsetRange(2, 7, 7),
            ),
        ),
    )


def test_empty_store(checkpoints, lake):
    assert not lake.exists(CHECKPOINTS.name)
    assert checkpoints.plans("s") == []
    assert checkpoints.latest_plan("s") is None
    assert checkpoints.states("s", 1) == {}
    assert not checkpoints.is_done("s", 1)
    assert checkpoints.rows("s").num_rows == 0
    with pytest.raises(LookupError):
        checkpoints.plan("s", 1)


def test_record_plan_stores_once(checkpoints, lake):
    plan = make_plan("s", 1)
    assert checkpoints.record_plan(plan) is True
    assert checkpoints.record_plan(plan) is False
    # A different slice under the same batch id is refused too: the first plan wins.
    other = BatchPlan("s", 1, KafkaSlice("t.activities", (OffsetRange(0, 0, 999),)))
    assert checkpoints.record_plan(other) is False
    assert checkpoints.plans("s") == [plan]
    rows = checkpoints.rows("s").to_pylist()
    assert len(rows) == 1
    assert rows[0]["process"] == PLAN and rows[0]["state"] == "planned"
    assert json.loads(rows[0]["ranges"]) == [[0, 0, 10], [1, 0, 5], [2, 7, 7]]
    assert lake.table(CHECKPOINTS.name).metadata().partition_columns == ["stream"]


def test_plans_round_trip(checkpoints):
    plans = [make_plan("s", i) for i in (1, 2, 3)]
    for p in plans:
        assert checkpoints.record_plan(p)
    assert checkpoints.plans("s") == plans
    assert checkpoints.latest_plan("s") == plans[-1]
    for p in plans:
        got = checkpoints.plan("s", p.batch_id)
        assert got == p
        assert got.ranges == p.ranges
        assert got.run_key == p.run_key
        assert got.topic == "t.activities"
    with pytest.raises(LookupError):
        checkpoints.plan("s", 4)


def test_plans_sorted_by_batch_id_numerically(checkpoints):
    # 2 and 10: string order would put 10 first.
    for i in (1, 2, 9, 10, 11):
        assert checkpoints.record_plan(make_plan("s", i))
    assert [p.batch_id for p in checkpoints.plans("s")] == [1, 2, 9, 10, 11]
    assert checkpoints.latest_plan("s").batch_id == 11


def test_states_show_latest_state_per_process(checkpoints):
    plan = make_plan("s", 1)
    checkpoints.record_plan(plan)
    assert checkpoints.states("s", 1) == {PLAN: "planned"}

    checkpoints.record_state(plan, "engagement_activity", "started")
    checkpoints.record_state(plan, "engagement_activity", "committed", table_version=3, rows=10)
    checkpoints.record_state(plan, "engagement_notifications", "already_committed")
    assert checkpoints.states("s", 1) == {
        PLAN: "planned",
        "engagement_activity": "committed",
        "engagement_notifications": "already_committed",
    }
    assert not checkpoints.is_done("s", 1)

    rows = [r for r in checkpoints.rows("s").to_pylist() if r["state"] == "committed"]
    assert len(rows) == 1
    assert rows[0]["table_version"] == 3
    assert json.loads(rows[0]["detail"]) == {"rows": 10}
    assert rows[0]["ranges"] == plan.ranges_json()
    assert rows[0]["recorded_at"] is not None

    # Repeating a state for the same batch is a no-op (its txn is already there).
    checkpoints.record_state(plan, "engagement_activity", "committed", table_version=99)
    assert [r["table_version"] for r in checkpoints.rows("s").to_pylist() if r["state"] == "committed"] == [3]


def test_states_are_per_batch(checkpoints):
    p1, p2 = make_plan("s", 1), make_plan("s", 2)
    for p in (p1, p2):
        checkpoints.record_plan(p)
    checkpoints.record_state(p1, "step", "committed")
    checkpoints.mark_done(p1)
    checkpoints.record_state(p2, "step", "started")
    assert checkpoints.states("s", 1) == {PLAN: "planned", "step": "committed", BATCH: "done"}
    assert checkpoints.states("s", 2) == {PLAN: "planned", "step": "started"}
    assert checkpoints.is_done("s", 1)
    assert not checkpoints.is_done("s", 2)


def test_is_done_after_mark_done(checkpoints):
    plan = make_plan("s", 1)
    checkpoints.record_plan(plan)
    assert not checkpoints.is_done("s", 1)
    checkpoints.mark_done(plan, engagement_activity_version=4)
    assert checkpoints.is_done("s", 1)
    done = [r for r in checkpoints.rows("s").to_pylist() if r["process"] == BATCH]
    assert len(done) == 1 and done[0]["state"] == "done"
    assert json.loads(done[0]["detail"]) == {"engagement_activity_version": 4}
    # Marking again is harmless.
    checkpoints.mark_done(plan)
    assert checkpoints.is_done("s", 1)
    assert len([r for r in checkpoints.rows("s").to_pylist() if r["process"] == BATCH]) == 1


def test_streams_are_isolated(checkpoints, lake):
    a1, a2 = make_plan("stream.a", 1), make_plan("stream.a", 2)
    b1 = make_plan("stream.b", 1, topic="t.other", base=1000)
    assert checkpoints.record_plan(a1)
    assert checkpoints.record_plan(b1)  # same batch id, other stream: its own txn
    assert checkpoints.record_plan(a2)
    checkpoints.mark_done(b1)

    assert checkpoints.plans("stream.a") == [a1, a2]
    assert checkpoints.plans("stream.b") == [b1]
    assert checkpoints.latest_plan("stream.b").topic == "t.other"
    assert checkpoints.plan("stream.b", 1).ranges[0] == OffsetRange(0, 1000, 1010)
    assert checkpoints.is_done("stream.b", 1)
    assert not checkpoints.is_done("stream.a", 1)
    assert checkpoints.states("stream.a", 1) == {PLAN: "planned"}
    assert checkpoints.plans("stream.c") == []
    assert set(checkpoints.rows("stream.a")["stream"].to_pylist()) == {"stream.a"}

    # Each stream is its own partition of the table.
    partitions = set(lake.file_stats(CHECKPOINTS.name)["partition.stream"].to_pylist())
    assert partitions == {"stream.a", "stream.b"}


def test_store_survives_reopen(lake):
    from engagement_platform.lake.checkpoints import CheckpointStore
    from engagement_platform.lake.delta import DeltaLake

    plan = make_plan("s", 1)
    CheckpointStore(lake).record_plan(plan)
    CheckpointStore(lake).mark_done(plan)
    fresh = CheckpointStore(DeltaLake(lake.root))
    assert fresh.latest_plan("s") == plan
    assert fresh.is_done("s", 1)
    assert fresh.record_plan(plan) is False


def test_checkpoint_partition_is_compacted_every_n_batches(checkpoints, lake, monkeypatch):
    from engagement_platform.lake import checkpoints as module

    monkeypatch.setattr(module, "COMPACT_EVERY", 3)
    files = []
    for batch in (1, 2, 3):
        plan = BatchPlan("s", batch, KafkaSlice("t", (OffsetRange(0, batch * 10, batch * 10 + 10),)))
        checkpoints.record_plan(plan)
        checkpoints.mark_done(plan)
        files.append(len(lake.file_stats(module.CHECKPOINTS.name)))
    assert files[:2] == [2, 4] and files[2] == 1
    assert [p.batch_id for p in checkpoints.plans("s")] == [1, 2, 3]
    assert all(checkpoints.is_done("s", b) for b in (1, 2, 3))


def commits(lake) -> int:
    return len(lake.table(CHECKPOINTS.name).history())


def test_every_slice_kind_is_stored_and_read_back(checkpoints):
    until = datetime(2026, 1, 5, 10, tzinfo=UTC)
    plans = [
        make_plan("kafka", 1),
        BatchPlan("ingest.rewards", 1, FileSlice("/landing/rewards/a.csv", 1234)),
        BatchPlan(
            "ingest.orders",
            1,
            FileSetSlice((FileSlice("/landing/orders/a.csv", 3), FileSlice("/landing/orders/b.csv", 4))),
        ),
        BatchPlan("profile_processor/acme", 1, TableVersionsSlice("profile_cdc_staging", -1, 7)),
        BatchPlan(
            "profile_backfill/acme",
            1,
            SnapshotSlice("/exports/acme", until, (("a.jsonl", 10, 1), ("b.parquet", 20, None))),
        ),
    ]
    assert checkpoints.record_plans(plans) == plans
    for p in plans:
        assert checkpoints.plan(p.stream, 1) == p
        checkpoints.mark_done(p)
        assert checkpoints.latest(p.stream) == (p, True)
    rows = {r["stream"]: r for r in checkpoints.rows_of([p.stream for p in plans]).to_pylist() if r["process"] == PLAN}
    assert rows["ingest.rewards"]["topic"] == "/landing/rewards/a.csv"
    assert json.loads(rows["ingest.rewards"]["ranges"]) == {
        "kind": "file",
        "path": "/landing/rewards/a.csv",
        "size": 1234,
    }
    assert rows["profile_processor/acme"]["topic"] == "profile_cdc_staging"
    assert rows["ingest.orders"]["topic"] == "/landing/orders/"


def test_rows_written_in_the_old_format_read_back_as_kafka_plans(checkpoints, lake):
    row = dict(
        stream="ingest.rewards",
        batch_id=1,
        process=PLAN,
        state="planned",
        topic="/landing/a.csv",
        ranges="[[0, 0, 99]]",
        recorded_at=datetime.now(UTC),
    )
    lake.append(CHECKPOINTS, pa.Table.from_pylist([row], schema=CHECKPOINTS.schema), BatchTxn("ingest.rewards/plan", 1))
    (plan,) = checkpoints.plans("ingest.rewards")
    assert plan.slice == KafkaSlice("/landing/a.csv", (OffsetRange(0, 0, 99),))
    assert plan.slice_as(FileSlice) == FileSlice("/landing/a.csv", 99)


def test_many_plans_and_batches_in_one_commit_each(checkpoints, lake):
    plans = [make_plan(f"tenant/{t}", 1) for t in "abc"]
    assert checkpoints.record_plans(plans) == plans
    assert commits(lake) == 2  # created, then one commit for every plan
    # Planned again with one more: only the new plan is stored; the others' txns are there.
    more = plans + [make_plan("tenant/d", 1)]
    assert checkpoints.record_plans(more) == more[3:]
    assert checkpoints.record_plans(plans) == [] and commits(lake) == 3
    assert checkpoints.latest_of([p.stream for p in more] + ["tenant/none"]) == {
        **{p.stream: (p, False) for p in more},
        "tenant/none": (None, False),
    }

    checkpoints.finish_batches(
        [(plans[0], {"t_a": 4, "progress": None}), (plans[1], {"t_b": None, "progress": 9})], stream="tenant"
    )
    assert commits(lake) == 4
    assert checkpoints.states("tenant/a", 1) == {
        PLAN: "planned",
        "t_a": "committed",
        "progress": "already_committed",
        BATCH: "done",
    }
    assert checkpoints.states("tenant/b", 1) == {
        PLAN: "planned",
        "t_b": "already_committed",
        "progress": "committed",
        BATCH: "done",
    }
    done = [r for r in checkpoints.rows("tenant/b").to_pylist() if r["process"] == BATCH]
    assert json.loads(done[0]["detail"]) == {"t_b_version": None, "progress_version": 9}
    assert lake.table(CHECKPOINTS.name).history(limit=1)[0]["stream"] == "tenant"
    latest = checkpoints.latest_of([p.stream for p in more])
    assert [latest[p.stream][1] for p in more] == [True, True, False, False]
    # Finishing again writes nothing: every row's txn is there.
    checkpoints.finish_batches([(plans[0], {"t_a": 4, "progress": None})])
    assert commits(lake) == 4


def test_finished_batches_compact_their_streams(checkpoints, lake, monkeypatch):
    from engagement_platform.lake import checkpoints as module

    monkeypatch.setattr(module, "COMPACT_EVERY", 2)
    for batch in (1, 2):
        plans = [make_plan(f"tenant/{t}", batch) for t in "ab"]
        checkpoints.record_plans(plans)
        checkpoints.finish_batches([(p, {"t": batch}) for p in plans])
    assert len(lake.file_stats(CHECKPOINTS.name)) == 2  # one file per stream's partition
    assert all(checkpoints.is_done(f"tenant/{t}", b) for t in "ab" for b in (1, 2))


def test_a_stream_nobody_committed_to_is_not_read_again_and_reads_stay_exact(checkpoints, lake, monkeypatch):
    """What sensor ticks ask (rows, plans, latest) is kept until a commit touches the stream's partition; a commit
    of another stream leaves it as it was; every answer equals a fresh read of the table (in ROW_ORDER)."""
    reads = []
    read = DeltaLake.read
    monkeypatch.setattr(DeltaLake, "read", lambda self, *a, **k: reads.append(a) or read(self, *a, **k))

    def fresh(stream: str) -> list[dict]:
        rows = read(lake, CHECKPOINTS.name, filters=[("stream", "=", stream)])
        return rows.sort_by([(c, "ascending") for c in ROW_ORDER]).to_pylist()

    a1, b1 = make_plan("a", 1), make_plan("b", 1)
    checkpoints.record_plan(a1)
    checkpoints.record_plan(b1)
    assert checkpoints.latest("a") == (a1, False) and checkpoints.rows("a").to_pylist() == fresh("a")
    asked = len(reads)
    assert checkpoints.latest("a") == (a1, False) and checkpoints.plans("a") == [a1]
    assert checkpoints.latest_batches(["a"])["a"].plan == a1 and len(reads) == asked, "nothing moved: no read"

    checkpoints.mark_done(b1)  # another stream's partition
    checkpoints.record_plan(make_plan("b", 2))
    assert checkpoints.latest("a") == (a1, False) and len(reads) == asked
    assert checkpoints.rows("a").to_pylist() == fresh("a")

    checkpoints.mark_done(a1)  # its own
    assert checkpoints.latest("a") == (a1, True) and checkpoints.is_done("a", 1)
    assert checkpoints.rows("a").to_pylist() == fresh("a") and len(reads) > asked
    assert checkpoints.latest_of(["a", "b"]) == {"a": (a1, True), "b": (make_plan("b", 2), False)}


def test_latest_batches_read_only_the_files_of_each_stream_s_newest_batch(checkpoints, lake, monkeypatch):
    from engagement_platform.lake import checkpoints as module

    batches = {"tenant/a": 5, "tenant/b": 2, "tenant/c": 3}
    for batch in range(1, 6):
        plans = [make_plan(stream, batch) for stream, last in batches.items() if batch <= last]
        checkpoints.record_plans(plans)
        finished = [p for p in plans if not (p.stream == "tenant/c" and p.batch_id == 3)]  # c's newest is open
        checkpoints.finish_batches([(p, {"t": p.batch_id}) for p in finished])
    read = []
    reader = module.read_parquet
    monkeypatch.setattr(
        module, "read_parquet", lambda fs, path, *a, **k: read.append(path) or reader(fs, path, *a, **k)
    )
    module.TABLES.clear()

    latest = checkpoints.latest_batches(list(batches))

    assert {s: (b.plan, b.done) for s, b in latest.items()} == {
        "tenant/a": (make_plan("tenant/a", 5), True),
        "tenant/b": (make_plan("tenant/b", 2), True),
        "tenant/c": (make_plan("tenant/c", 3), False),
    }
    # the plan file and the finish file of the newest batch (c's only has its plan), of 19 files in all
    assert len(read) == 5 and len(lake.file_stats(CHECKPOINTS.name)) == 19
    assert all(latest[s].planned_at == checkpoints.planned_at(s, batches[s]) for s in batches)
