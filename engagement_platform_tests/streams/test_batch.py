"""The commit lifecycle on a local lake (no servers): each table once per batch with its txn, shared tables in
one commit for many batches, fault points in step order, a failing batch leaving the others done."""

from __future__ import annotations

import pyarrow as pa
import pytest

from engagement_platform.lake.delta import TableSpec
from engagement_platform.streams import batch as lifecycle
from engagement_platform.streams.batch import AppendStep, Batch, CommitStep, commit_batch, commit_batches
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import BatchPlan, KafkaSlice

SCHEMA = pa.schema([("id", pa.int64()), ("batch_id", pa.int64())])
SHARED = TableSpec(
    "shared_progress", pa.schema([("stream", pa.string()), ("batch_id", pa.int64()), ("rows", pa.int64())])
)


def plan(stream: str, batch_id: int = 1) -> BatchPlan:
    return BatchPlan(stream, batch_id, KafkaSlice("t", (OffsetRange(0, 0, 3),)))


def own_table(lake, name: str, fail: bool = False) -> CommitStep:
    def commit(txn, outcomes):
        if fail:
            raise RuntimeError(f"{name} refused")
        return lake.append(
            TableSpec(name, SCHEMA), pa.table({"id": [1, 2], "batch_id": [txn.version] * 2}, schema=SCHEMA), txn
        )

    return CommitStep(name, commit, phase="own")


def shared_rows(lake, p: BatchPlan, own: str) -> AppendStep:
    return AppendStep(
        lake, SHARED, lambda outcomes: [dict(stream=p.stream, batch_id=p.batch_id, rows=outcomes[own])], phase="shared"
    )


def batches(lake, streams: list[str], failing: str | None = None) -> list[Batch]:
    out = []
    for s in streams:
        p = plan(s)
        own = f"own_{s}"
        out.append(
            Batch(p, f"app/{s}", [own_table(lake, own, fail=s == failing), shared_rows(lake, p, own)], {"tenant": s})
        )
    return out


def test_commit_batch_commits_each_table_once_then_finishes(lake, checkpoints):
    p = plan("s")
    checkpoints.record_plan(p)
    steps = [own_table(lake, "a"), own_table(lake, "b")]
    assert commit_batch(p, "app", steps, checkpoints, extra="x") == {"a": 1, "b": 1}
    assert checkpoints.states("s", 1) == {"plan": "planned", "a": "committed", "b": "committed", "batch": "done"}
    (commit,) = [h for h in lake.table("a").history() if h.get("app_id") == "app"]
    assert (commit["stream"], commit["extra"], commit["batch_id"]) == ("s", "x", "1")
    # A re-run of the same plan finds every table's txn: nothing is written twice.
    assert commit_batch(p, "app", steps, checkpoints) == {"a": None, "b": None}
    assert lake.read("a").num_rows == lake.read("b").num_rows == 2
    assert checkpoints.states("s", 1)["a"] == "already_committed"


def test_commit_batches_share_one_commit_per_shared_table(lake, checkpoints):
    todo = batches(lake, ["x", "y", "z"])
    checkpoints.record_plans([b.plan for b in todo])
    committed = commit_batches(todo, checkpoints, threads=2, stream="family")
    assert committed.outcomes == [
        {"own_x": 1, "shared_progress": 1},
        {"own_y": 1, "shared_progress": 1},
        {"own_z": 1, "shared_progress": 1},
    ]
    assert set(committed.seconds) == {"own", "shared", "checkpoints"}
    assert lake.read(SHARED.name).sort_by("stream").to_pylist() == [dict(stream=s, batch_id=1, rows=1) for s in "xyz"]
    history = lake.table(SHARED.name).history(limit=1)[0]
    assert (history["batches"], history["stream"]) == ("3", "family")
    assert all(lake.committed_version(SHARED.name, f"app/{s}") == 1 for s in "xyz")
    (own,) = [h for h in lake.table("own_y").history() if h.get("app_id") == "app/y"]
    assert (own["stream"], own["tenant"]) == ("y", "y")
    assert all(checkpoints.is_done(s, 1) for s in "xyz")

    # One more batch with the same three: only its rows are new, the others are skipped.
    again = batches(lake, ["x", "y", "z", "w"])
    checkpoints.record_plans([b.plan for b in again])
    assert [o["shared_progress"] for o in commit_batches(again, checkpoints).outcomes] == [None, None, None, 2]
    assert lake.read(SHARED.name).num_rows == 4


def test_a_failing_batch_leaves_the_others_done_then_raises(lake, checkpoints):
    todo = batches(lake, ["x", "y", "z"], failing="y")
    checkpoints.record_plans([b.plan for b in todo])
    with pytest.raises(RuntimeError, match="own_y refused"):
        commit_batches(todo, checkpoints, threads=2)
    assert [checkpoints.is_done(s, 1) for s in "xyz"] == [True, False, True]
    assert sorted(lake.read(SHARED.name)["stream"].to_pylist()) == ["x", "z"]
    assert checkpoints.states("y", 1) == {"plan": "planned"}


def test_failpoints_follow_each_step_in_order(lake, checkpoints, monkeypatch):
    reached = []
    monkeypatch.setattr(lifecycle, "failpoint", lambda stream, step: reached.append(f"{stream}:after:{step}"))
    commit_batches(batches(lake, ["x", "y"]), checkpoints)
    assert reached == ["x:after:own_x", "y:after:own_y", "x:after:shared_progress", "y:after:shared_progress"]


def test_batches_need_the_same_number_of_steps(lake, checkpoints):
    uneven = batches(lake, ["x", "y"])
    uneven[1].steps.pop()
    with pytest.raises(ValueError, match="same number of steps"):
        commit_batches(uneven, checkpoints)


class FakeLease:
    """Stands in for a coordinator lease: `check` raises once `lost` is set."""

    def __init__(self):
        self.token, self.lock_name, self.owner, self.checks, self.lost = 41, "profile_raw/x", "owner/1", 0, False

    def check(self):
        self.checks += 1
        if self.lost:
            raise RuntimeError("lease lost")


def test_commits_are_fenced_by_the_active_lease(lake, checkpoints):
    lease = FakeLease()
    todo = batches(lake, ["x", "y"])
    with lifecycle.fenced(lease):
        commit_batches(todo, checkpoints, threads=2)
    assert lease.checks == 3  # before each own table's commit, then once before the shared commit
    own = [h for h in lake.table("own_x").history() if h.get("app_id") == "app/x"][0]
    shared = lake.table(SHARED.name).history(limit=1)[0]
    for meta in (own, shared):
        assert (meta["fencing_token"], meta["lock_name"], meta["lock_owner"]) == ("41", "profile_raw/x", "owner/1")

    lease.lost = True
    with lifecycle.fenced(lease), pytest.raises(RuntimeError, match="lease lost"):
        commit_batch(plan("z"), "app/z", [own_table(lake, "own_z")], checkpoints)
    assert not lake.exists("own_z") and not checkpoints.is_done("z", 1)
