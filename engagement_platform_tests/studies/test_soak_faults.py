"""The soak's fault scheduling (benchmarks/soak/faults.py) with the injection itself replaced by a sleep: faults
overlap up to the bound, never two on one target, start late rather than never inside the window, and faults that
must outlast a ZooKeeper session are planned so. Pure: no process is signalled."""

from __future__ import annotations

import random
import threading
import time

from benchmarks.soak.faults import (
    CONTROL,
    KINDS,
    TARGETS,
    ZK_SESSION_TIMEOUT_S,
    Fault,
    Injector,
    Sample,
    control_moments,
    plan_faults,
    recovery_seconds,
    resumed_seconds,
    summary,
)


class Timed(Injector):
    """Records (kind, start, end) instead of signalling anything."""

    def __init__(
        self,
        faults: list[Fault],
        window_s: float,
        max_concurrent: int,
        spaced: list[Sample] | None = None,
        gap_s: tuple[float, float] = (45.0, 90.0),
    ):
        super().__init__(
            faults,
            time.monotonic(),
            window_s,
            {"EP_STATE_DIR": "/nonexistent"},
            daemon=None,
            rng=random.Random(0),
            max_concurrent=max_concurrent,
            spaced=spaced,
            gap_s=gap_s,
        )
        self.spans: list[tuple[str, float, float]] = []
        self.spans_lock = threading.Lock()

    def inject(self, fault: Fault) -> None:
        fault.injected = self.now()
        time.sleep(fault.hold)
        fault.cleared = self.now()
        with self.spans_lock:
            self.spans.append((fault.kind, fault.injected, fault.cleared))


def most_at_once(spans) -> int:
    return max(sum(1 for _, s, e in spans if s <= t < e) for _, t, _ in spans)


def test_faults_overlap_up_to_the_bound_and_never_two_on_one_target():
    faults = [
        Fault("zookeeper_restart", 0.0, 0.4),
        Fault("zookeeper_session_expiry", 0.05, 0.2),
        Fault("broker_restart", 0.1, 0.4),
        Fault("run_kill", 0.15, 0.2),
        Fault("run_pause", 0.2, 0.2),
        Fault("daemon_kill", 5.0, 0.1),
    ]
    injector = Timed(faults, window_s=3.0, max_concurrent=2)
    injector.start()
    injector.join(10)
    by_kind = {f.kind: f for f in faults}
    assert all(
        by_kind[k].injected is not None
        for k in ("zookeeper_restart", "zookeeper_session_expiry", "broker_restart", "run_kill", "run_pause")
    )
    assert by_kind["zookeeper_session_expiry"].injected >= by_kind["zookeeper_restart"].cleared, (
        "one fault per server at a time"
    )
    assert by_kind["broker_restart"].injected < by_kind["zookeeper_restart"].cleared, "another target overlaps"
    assert (
        by_kind["run_kill"].injected
        >= min(by_kind["zookeeper_restart"].cleared, by_kind["broker_restart"].cleared) - 0.01
    ), "waits for a slot"
    assert most_at_once(injector.spans) == 2
    assert by_kind["daemon_kill"].injected is None and "window" in by_kind["daemon_kill"].detail, (
        "planned after the window: not injected"
    )


def test_one_at_a_time_is_sequential():
    faults = [Fault(kind, 0.01 * i, 0.1) for i, kind in enumerate(("run_kill", "broker_restart", "spark_restart"))]
    injector = Timed(faults, window_s=3.0, max_concurrent=1)
    injector.start()
    injector.join(10)
    assert most_at_once(injector.spans) == 1 and len(injector.spans) == 3


def test_planned_faults_cover_every_kind_and_session_faults_outlast_the_session():
    faults = plan_faults(random.Random(5), 400, 1800)
    assert {f.kind for f in faults} == set(KINDS) and all(60 <= f.planned <= 1800 for f in faults)
    assert all(f.hold > ZK_SESSION_TIMEOUT_S for f in faults if f.kind in ("run_pause", "zookeeper_session_expiry"))
    assert set(TARGETS) <= set(KINDS)
    in_turn = [f.kind for f in plan_faults(random.Random(5), 2 * len(KINDS), 1800, every_kind_in_turn=True)]
    assert sorted(in_turn[: len(KINDS)]) == sorted(KINDS) and in_turn[len(KINDS) :] == in_turn[: len(KINDS)]


def test_back_to_committing_waits_for_every_stream_that_had_records_waiting_and_caught_up_for_all_of_them():
    """Ingestion has records waiting when the fault clears at t=10 and commits part of them at t=30, all at t=50;
    mutation has nothing waiting (not waited for) and the third stream commits at t=40: back to committing takes
    30 s (the last waiting stream's first commit), caught up 40 s; a fault after which a waiting stream never
    moves is None in both."""

    def sample(t, ingested, mutated, erased):
        return Sample(
            t,
            {"ingestion": {0: ingested}, "mutation": {0: mutated}, "retention": {0: erased}},
            {"ingestion": {0: 100}, "mutation": {0: 5}, "retention": {0: 8}},
        )

    samples = [
        sample(10, 40, 5, 6),
        sample(20, 40, 5, 6),
        sample(30, 70, 5, 6),
        sample(40, 70, 5, 8),
        sample(50, 100, 5, 8),
    ]
    cleared = Fault("broker_restart", 0, 5, injected=5, cleared=10)
    assert resumed_seconds([cleared], samples) == {"broker_restart": [30]}
    assert recovery_seconds([cleared], samples) == {"broker_restart": [40]}
    stuck = [sample(10, 40, 5, 6), sample(60, 40, 5, 8)]
    assert resumed_seconds([cleared], stuck) == {"broker_restart": [None]}
    assert recovery_seconds([cleared], stuck) == {"broker_restart": [None]}
    assert resumed_seconds([Fault("run_kill", 0, 5, injected=5)], samples) == {}  # never cleared: not measured


def test_spaced_faults_wait_for_the_platform_to_be_back_to_committing_after_the_one_before():
    """The stream has records waiting throughout; the second fault is injected only once a sample shows it
    committed past where it stood when the first fault cleared (no quiet gap here, to see the wait alone)."""
    samples: list[Sample] = []
    faults = [Fault("run_kill", 0.0, 0.05), Fault("broker_restart", 0.0, 0.05)]
    injector = Timed(faults, window_s=60.0, max_concurrent=1, spaced=samples, gap_s=(0.0, 0.0))
    waiting = {"ingestion": {0: 100}}
    injector.start()
    deadline = time.monotonic() + 10
    while faults[0].cleared is None and time.monotonic() < deadline:
        time.sleep(0.01)
    for _ in range(5):  # the stream has not committed: the second fault waits
        samples.append(Sample(injector.now(), {"ingestion": {0: 10}}, waiting))
        time.sleep(0.3)
    assert faults[1].injected is None, "the second fault waits while a stream with records waiting has not committed"
    committed_at = injector.now()
    samples.append(Sample(committed_at, {"ingestion": {0: 20}}, waiting))
    while faults[1].injected is None and time.monotonic() < deadline:
        time.sleep(0.01)
    injector.halt.set()  # it would wait for the second fault's recovery next
    injector.join(10)
    assert faults[1].injected is not None and faults[1].injected >= committed_at


def test_control_moments_are_the_quiet_ones_and_summary_reports_them_beside_the_faults():
    faults = [
        Fault("run_kill", 100, 5, injected=100, cleared=105),
        Fault("broker_restart", 400, 5, injected=400, cleared=410),
    ]
    samples = [
        Sample(t, {"ingestion": {0: t // 100}}, {"ingestion": {0: 1000}}) for t in range(0, 800, 10)
    ]  # a commit every 100 s
    moments = control_moments(faults, samples, window_s=700, every=50, start=50)
    # spans: run_kill 100-200 (back to committing at the commit of 200), broker_restart 400-500. Left out: a moment
    # whose own measure (until the next commit) reaches a fault's injection (50, 300, 350) or never ends (700)
    assert [m.injected for m in moments] == [250, 550, 600, 650]
    assert all(m.kind == CONTROL and m.cleared == m.injected for m in moments)
    assert resumed_seconds(moments, samples)[CONTROL] == [50, 50, 100, 50], "until the next commit after each moment"
    lines = summary(faults, samples, window_s=700)
    assert lines[-1].startswith(f"{CONTROL} (control:") and "back to committing median" in lines[-1]
