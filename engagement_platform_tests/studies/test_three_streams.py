"""The with/without-coordinator test of "Global Synchronousness and Ordering in Delta Lake": three simulated
streams on one real Delta table, against the real test ZooKeeper (a fresh root per run), plus a conflict forced
by construction."""

from __future__ import annotations

import uuid

import pytest
from deltalake.exceptions import CommitFailedError
from kazoo.client import KazooClient

from benchmarks.three_streams.simulation import (
    MUTATION,
    RETENTION,
    RULES,
    Window,
    Workload,
    apply_batch,
    count_overlaps,
    order_violations,
    run_simulation,
    seed_rows,
)
from benchmarks.three_streams.timeline import draw_timeline
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.streams.coordinator import Coordinator

WORKLOAD = Workload().scaled(ingestion=12, mutation=4, retention=2)


@pytest.fixture(scope="module")
def runs(stack, tmp_path_factory):
    """Both modes once for the module (about 3 s each): coordinated, then uncoordinated."""
    root = f"/tests/simulation/{uuid.uuid4().hex}"
    hosts = stack["ZOOKEEPER_HOSTS"]
    coordinated = run_simulation(str(tmp_path_factory.mktemp("on")), WORKLOAD, lambda: Coordinator(hosts, root))
    uncoordinated = run_simulation(str(tmp_path_factory.mktemp("off")), WORKLOAD, None)
    yield coordinated, uncoordinated
    zk = KazooClient(hosts)
    zk.start(timeout=5)
    zk.delete(root, recursive=True)
    zk.stop()
    zk.close()


def test_coordinated_run_has_no_overlap_no_conflict_and_keeps_the_order(runs):
    on, _ = runs
    assert on.overlaps == 0 and on.conflicts == 0
    assert on.order_violations() == [], [s for s, _, _ in on.registrations]
    assert on.content_matches and on.exactly_once
    # Fencing tokens grow along the registration sequence: one lock, one holder at a time.
    tokens = [t for _, _, t in on.registrations]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    # Each committed window lies inside its own lease: windows never interleave.
    ran = sorted((w for w in on.windows if w.outcome == "committed"), key=lambda w: w.start)
    assert all(a.end <= b.start for a, b in zip(ran, ran[1:]))
    # Every mutation batch registered directly after an ingestion batch.
    names = [s for s, _, _ in on.registrations]
    assert all(names[i - 1] == "ingestion" for i, s in enumerate(names) if s == MUTATION and i)


def test_uncoordinated_run_overlaps_yet_ends_with_the_exact_content(runs):
    _, off = runs
    # All three streams start at t=0 and retention computes for 0.25 s: its first window overlaps.
    assert off.overlaps > 0
    assert off.content_matches and off.exactly_once  # conflicts were re-run, none committed twice
    assert all(w.token is None for w in off.windows)


def test_conflict_forced_then_recovered_by_rereading(tmp_path):
    """Two writers read the same version; retention deletes rows from the seed files, then
    mutation's MERGE over the same files is refused. Re-reading the table and re-running commits."""
    lake = DeltaLake(str(tmp_path / "lake"))
    lake.append(ENGAGEMENT_ACTIVITY, seed_rows(WORKLOAD), BatchTxn("simulation.seed", 0))
    stale_a, stale_b = lake.table(ENGAGEMENT_ACTIVITY.name), lake.table(ENGAGEMENT_ACTIVITY.name)
    apply_batch(stale_a, WORKLOAD, RETENTION, 1, BatchTxn("simulation.retention", 1))
    mutation = BatchTxn("simulation.mutation", 1)
    with pytest.raises(CommitFailedError):
        apply_batch(stale_b, WORKLOAD, MUTATION, 1, mutation)
    version, rows = apply_batch(lake.table(ENGAGEMENT_ACTIVITY.name), WORKLOAD, MUTATION, 1, mutation)
    assert version == 3 and rows > 0  # 0 create, 1 seed, 2 retention, 3 mutation
    # A second re-run (e.g. after a crash past the commit) is a no-op thanks to the txn version.
    assert apply_batch(lake.table(ENGAGEMENT_ACTIVITY.name), WORKLOAD, MUTATION, 1, mutation) == (None, 0)


def test_order_rule_and_overlap_counting():
    seq = [
        ("mutation", "mutation/1"),
        ("ingestion", "ingestion/1"),
        ("mutation", "mutation/2"),
        ("mutation", "mutation/2"),
        ("retention", "retention/1"),
        ("retention", "retention/2"),
    ]
    # first is free; a retry of the batch registered last is allowed; retention twice in a row is not
    assert order_violations(seq, RULES) == [5]
    assert order_violations(seq[:3] + [("mutation", "mutation/3")], RULES) == [3]
    w = [
        Window("ingestion", 1, 1, 0, 0.0, 1.0, "committed"),
        Window("mutation", 1, 1, 0, 0.5, 2.0, "conflict"),
        Window("retention", 1, 1, 0, 0.9, 0.9, "gave_up"),
        Window("ingestion", 2, 1, 0, 1.5, 3.0, "committed"),
    ]
    assert count_overlaps(w) == 2  # (i1, m1) and (m1, i2); a give-up ran nothing; same stream never counts


def test_timeline_png(runs, tmp_path):
    out = draw_timeline(list(runs), tmp_path / "docs" / "timeline.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
