"""Job coordinator cost: lock + register + unlock latency, and three streams' throughput with it vs without.

    .venv/bin/python benchmarks/coordination.py [--rounds 1000] [--ingestion 60] [--mutation 15] [--retention 5]

Starts only ZooKeeper (bench ports, fresh state). Part 1: one client runs `rounds` micro-batch
handshakes on one lock (lock, register with a predecessor rule, unlock), plus the fencing check a
writer makes before each commit; median and p99 per step. Part 2: the three simulated streams of
`streams/simulation.py` (ingestion appends, mutation MERGEs across every org, retention deletes)
run a fixed workload on one Delta table back to back (no cadence, no simulated compute: a backlog
drained as fast as the table takes it), once through the coordinator and once without it (conflicts
re-run from a fresh read). Throughput = committed batches and rows over wall time; the baseline is
the uncoordinated run in the same process, and the ratio is coordinated / uncoordinated.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: the benchmarks package
from _stack import bench_stack, machine  # noqa: E402
from record import invocation, record_result  # noqa: E402

from benchmarks.three_streams.simulation import StreamConfig, Workload, run_simulation  # noqa: E402
from engagement_platform.streams.coordinator import Coordinator, JobSpec  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def handshake_latency(hosts: str, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per step; the job may follow itself, so every round registers (no give-ups)."""
    coord = Coordinator(hosts, root=f"/bench/coordination/{uuid.uuid4().hex}")
    coord.start()
    job = JobSpec("engagement_activity", "ingestion", frozenset({"ingestion"}))
    steps: dict[str, list[float]] = {
        "lock": [],
        "register": [],
        "fencing check": [],
        "unlock": [],
        "lock+register+unlock": [],
    }
    try:
        for i in range(rounds + 50):  # the first 50 warm the session and the server's caches
            t0 = time.perf_counter()
            lease = coord.lock(job.lock_name, f"ingestion/{i}", timeout_s=5)
            t1 = time.perf_counter()
            coord.register(lease, job.job_name, job.predecessors)
            t2 = time.perf_counter()
            lease.check()
            t3 = time.perf_counter()
            coord.unlock(lease)
            t4 = time.perf_counter()
            if i >= 50:
                for name, ms in (
                    ("lock", t1 - t0),
                    ("register", t2 - t1),
                    ("fencing check", t3 - t2),
                    ("unlock", t4 - t3),
                    ("lock+register+unlock", (t4 - t0) - (t3 - t2)),
                ):
                    steps[name].append(ms * 1000)
    finally:
        coord.close()
    return steps


def workload(args) -> Workload:
    return Workload(
        orgs=args.orgs,
        seed_rows_per_org=args.seed_rows,
        rows_per_ingest=args.rows_per_ingest,
        streams=(
            StreamConfig("ingestion", args.ingestion, 0.0, 0.0, keep_alive=True),
            StreamConfig("mutation", args.mutation, 0.0, 0.0),
            StreamConfig("retention", args.retention, 0.0, 0.0),
        ),
        lock_timeout_s=30.0,
        max_conflict_retries=100_000,  # without the coordinator a MERGE may lose to many appends in a row
        deadline_s=600.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--ingestion", type=int, default=60)
    parser.add_argument("--mutation", type=int, default=15)
    parser.add_argument("--retention", type=int, default=5)
    parser.add_argument("--orgs", type=int, default=8)
    parser.add_argument(
        "--seed-rows", type=int, default=2000, help="seed rows per org (what mutation and retention rewrite)"
    )
    parser.add_argument("--rows-per-ingest", type=int, default=2000)
    args = parser.parse_args()

    with bench_stack("coordination", servers=("zookeeper",)) as env:
        hosts = env["ZOOKEEPER_HOSTS"]
        print(f"machine: {machine()}; load average at start {os.getloadavg()[0]:.2f}")
        print(f"ZooKeeper started in {env['stack_start_seconds']:.1f} s")

        steps = handshake_latency(hosts, args.rounds)
        print(f"handshake, {args.rounds} rounds on one lock (ms): step median p99")
        for name, values in steps.items():
            print(f"  {name:22s} {statistics.median(values):7.2f} {pct(values, 0.99):7.2f}")

        w = workload(args)
        results = {}
        for mode in ("coordinated", "uncoordinated"):
            root = f"/bench/coordination/{uuid.uuid4().hex}"
            factory = (lambda: Coordinator(hosts, root)) if mode == "coordinated" else None
            with tempfile.TemporaryDirectory(dir=env["EP_STATE_DIR"]) as d:
                results[mode] = run_simulation(d, w, factory)
        print(
            f"three streams, fixed workload: {args.orgs} orgs x {args.seed_rows} seed rows; ingestion {args.ingestion} x "
            f"{args.rows_per_ingest} rows, mutation {args.mutation} MERGEs, retention {args.retention} deletes; rules {dict((k, sorted(v)) for k, v in w.rules.items())}"
        )
        for mode, r in results.items():
            s = r.summary()
            attempts = sum(w.outcome in ("committed", "conflict") for w in r.windows)
            print(
                f"  {mode:13s} {s['elapsed_s']:6.2f} s  {s['batches_per_s']:6.2f} batches/s  {s['rows_per_s']:9.1f} rows/s  "
                f"rows {s['rows_committed']}  attempts {attempts}  conflicts {s['conflicts']} "
                f"(by stream {_by_stream(r, 'conflict')})  give-ups {s['gave_up']}  idle {s['idle']}  overlaps {s['overlaps']}  "
                f"order violations {s['order_violations']}  content exact {s['content_matches']}  exactly once {s['exactly_once']}"
            )
            assert s["content_matches"] and s["exactly_once"], mode
        on, off = results["coordinated"], results["uncoordinated"]
        print(
            f"ratio coordinated / uncoordinated: batches/s {on.summary()['batches_per_s'] / off.summary()['batches_per_s']:.2f}, "
            f"wall time {on.elapsed_s / off.elapsed_s:.2f}"
        )
        print(f"load average at end {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    handshake = steps["lock+register+unlock"]
    record_result(
        "coordination",
        invocation(),
        f"{args.rounds:,} handshake rounds; three streams on one table ({args.orgs} orgs x {args.seed_rows:,} seed rows): "
        f"ingestion {args.ingestion} x {args.rows_per_ingest:,} rows, mutation {args.mutation} MERGEs, retention "
        f"{args.retention} deletes",
        {
            "handshake_median_ms": round(statistics.median(handshake), 2),
            "handshake_p99_ms": round(pct(handshake, 0.99), 2),
            "fencing_check_median_ms": round(statistics.median(steps["fencing check"]), 2),
            "batches_per_s": on.summary()["batches_per_s"],
            "ratio_to_baseline": round(on.summary()["batches_per_s"] / off.summary()["batches_per_s"], 2),
        },
        baseline={
            "what": "the same workload without the coordinator",
            "batches_per_s": off.summary()["batches_per_s"],
            "conflicts": off.summary()["conflicts"],
        },
    )


def _by_stream(result, outcome: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for w in result.windows:
        if w.outcome == outcome:
            counts[w.stream] = counts.get(w.stream, 0) + 1
    return counts


if __name__ == "__main__":
    main()
