"""The tenant lock against the real ZooKeeper: a backfill and a processor run of one tenant, started
together. With the lock they serialize and both commit; without it the backfill's MERGE loses the
race (delta-rs CommitFailedError) and succeeds when its batch is re-run from its plan.

Deterministic: the backfill is held between its read of the raw table and its commit (the
`before_commit` hook) while the processor runs, which is exactly the window a real race needs."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from deltalake.exceptions import CommitFailedError

from engagement_platform.profiles.backfill.apply import backfill_app_id, backfill_stream, backfill_tenant
from engagement_platform.profiles.locks import tenant_lock, tenant_lock_name
from engagement_platform.profiles.processor.apply import process_tenant, processor_app_id, read_profiles
from engagement_platform.profiles.processor.progress import latest_progress
from engagement_platform.profiles.tables import raw_table_name
from engagement_platform.streams.coordinator import Coordinator, LockBusy
from engagement_platform_tests.support.cdc import new_topic, record, stage
from engagement_platform_tests.support.snapshots import UNTIL, snap, write_jsonl


@pytest.fixture
def coordinators(stack):
    # A generous session timeout: on a loaded machine a 4 s session can expire mid-test, which is the
    # fencing test's subject (streams/test_coordinator.py), not this one's.
    root = f"/tests/profile_locks/{uuid.uuid4().hex}"
    made = [Coordinator(stack["ZOOKEEPER_HOSTS"], root, session_timeout_s=20.0) for _ in range(2)]
    yield made
    for c in made:
        c.close()


@pytest.fixture
def prepared(spark, kafka, lake, checkpoints, tmp_path):
    """Changes staged for acme (not processed yet) and a snapshot export of acme."""
    stage(
        spark,
        kafka,
        lake,
        checkpoints,
        new_topic(kafka),
        [record("acme", "1", 12, {"c": 3}), record("acme", "9", 1, {"z": 1}, related=["3"])],
    )
    folder = tmp_path / "export"
    folder.mkdir()
    write_jsonl(folder / "snapshot.jsonl", [snap("1", 10, {"a": 2}), snap("3", 3, {"c": 1})])
    return folder


def fields(lake):
    return {r["primary_id"]: json.loads(r["fields"]) for r in read_profiles(lake, "acme").to_pylist()}


class Held:
    """A before_commit hook: tells the test the writer has read and computed, then waits for release."""

    def __init__(self):
        self.reached, self.release = threading.Event(), threading.Event()

    def __call__(self):
        self.reached.set()
        assert self.release.wait(120), "never released"


def in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as exc:  # surfaced by the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def commit_meta(lake, app_id):
    return [c for c in lake.table(raw_table_name("acme")).history() if c.get("app_id") == app_id]


def test_with_the_tenant_lock_backfill_and_processor_serialize_and_both_commit(
    spark, lake, checkpoints, prepared, coordinators
):
    backfill_zk, processor_zk = coordinators
    held = Held()

    def backfill():
        with tenant_lock(backfill_zk, "acme", "profile_backfill/acme/1"):
            return backfill_tenant(spark, lake, checkpoints, "acme", prepared, UNTIL, before_commit=held)

    def processor():
        with tenant_lock(processor_zk, "acme", "profile_processor/acme"):
            return process_tenant(spark, lake, checkpoints, "acme")

    b_thread, b_out = in_thread(backfill)
    assert held.reached.wait(120), b_out
    p_thread, p_out = in_thread(processor)
    p_thread.join(2.0)
    assert p_thread.is_alive(), ("the processor waits for the lock while the backfill holds it", p_out, b_out)
    assert "profile_backfill/acme/1" in processor_zk.holder(tenant_lock_name("acme"))
    assert "acme" not in latest_progress(lake)
    held.release.set()
    b_thread.join(120)
    p_thread.join(120)
    assert "error" not in b_out and "error" not in p_out, (b_out, p_out)

    # Backfill first (it held the lock), then the processor: the newer change folds over the snapshot.
    assert fields(lake) == {"1": {"a": 2, "c": 3}, "3": {"c": 1}, "9": {"z": 1}}
    rows = {r["primary_id"]: r for r in read_profiles(lake, "acme").to_pylist()}
    assert rows["3"]["related_ids"] == rows["9"]["related_ids"] == ["3", "9"]
    (b_commit,), (p_commit,) = commit_meta(lake, backfill_app_id("acme")), commit_meta(lake, processor_app_id("acme"))
    assert b_commit["lock_name"] == p_commit["lock_name"] == "profile_raw/acme"
    assert int(b_commit["fencing_token"]) < int(p_commit["fencing_token"])
    assert b_commit["version"] < p_commit["version"]


def test_without_the_lock_concurrent_merges_conflict_and_the_rerun_recovers(spark, lake, checkpoints, prepared):
    held = Held()

    def backfill():
        with tenant_lock(None, "acme", "profile_backfill/acme/1"):  # EP_COORDINATOR=off: no lock
            return backfill_tenant(spark, lake, checkpoints, "acme", prepared, UNTIL, before_commit=held)

    b_thread, b_out = in_thread(backfill)
    assert held.reached.wait(120), b_out
    with tenant_lock(None, "acme", "profile_processor/acme"):
        processed = process_tenant(spark, lake, checkpoints, "acme")  # commits while the backfill holds a stale read
    assert processed.changes_read == 2
    held.release.set()
    b_thread.join(120)
    assert isinstance(b_out.get("error"), CommitFailedError), b_out
    assert "concurrent" in str(b_out["error"])
    stream = backfill_stream("acme")
    assert not checkpoints.is_done(stream, 1) and not commit_meta(lake, backfill_app_id("acme"))

    # The failed batch is re-run from its plan (same batch id), against the table as it is now.
    rerun = backfill_tenant(spark, lake, checkpoints, "acme", prepared, UNTIL)
    assert rerun.plan.batch_id == 1 and checkpoints.is_done(stream, 1)
    # Processor first, then the backfill: id 1's snapshot row (seq 10) is older than the stored change (12).
    assert fields(lake) == {"1": {"c": 3}, "3": {"c": 1}, "9": {"z": 1}}
    rows = {r["primary_id"]: r for r in read_profiles(lake, "acme").to_pylist()}
    assert rows["3"]["related_ids"] == rows["9"]["related_ids"] == ["3", "9"]


def test_a_run_waits_its_turn_for_a_busy_tenant_lock_in_rounds_instead_of_giving_up(coordinators):
    """Waiting for another run of the tenant is normal operation: the second run waits in rounds of the
    lock timeout (reporting each round) and gets the lock once it is released, within its patience; only
    beyond its patience does it give up."""
    holder, waiter = coordinators
    held = holder.lock(tenant_lock_name("acme"), "processor/acme/first", 5.0)
    waiter.start()  # connected first: the first round's timeout also bounds opening the session
    rounds: list[float] = []
    thread, out = in_thread(lambda: _take(waiter, rounds, patience_s=30.0))
    deadline = time.monotonic() + 30
    while len(rounds) < 2 and time.monotonic() < deadline:  # released after two rounds, however long they took
        time.sleep(0.05)
    holder.unlock(held)
    thread.join(40)
    assert "error" not in out, out.get("error")
    assert len(rounds) >= 2 and out["result"] >= rounds[1], (out["result"], rounds)

    held = holder.lock(tenant_lock_name("acme"), "processor/acme/third", 5.0)
    try:
        with pytest.raises(LockBusy, match="not obtained within"):
            _take(waiter, [], patience_s=2.0)
    finally:
        holder.unlock(held)


def _take(coordinator, rounds: list[float], patience_s: float) -> float:
    with tenant_lock(
        coordinator, "acme", "backfill/acme/second", 1.0, patience_s, lambda busy, waited: rounds.append(waited)
    ) as lease:
        return lease.waited_s
