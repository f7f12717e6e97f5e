"""Three simulated streams on one Delta table, with or without the job coordinator.

The test of Salesforce's "Global Synchronousness and Ordering in Delta Lake": mocked ingestion, mutation and TTL jobs write the same table at their own
cadence, once with the coordinator and once without, and their run windows are compared. Here each
stream is a thread running micro-batches of a fixed workload on one real Delta table:

    ingestion  fast    append new activities (recent dates, every org)
    mutation   medium  one MERGE per batch rewriting a slice of the seed rows across every org
    retention  slow    delete the seed rows older than a cutoff that grows with each batch

Every attempt reads the table, "computes" for `compute_s` (a sleep, so windows can overlap), then
commits from the snapshot it read, as a Spark job does. The operations commute (simulation_workload.py),
so the final table is the same whatever the interleaving; both modes are checked against it.

Coordinated: `coordinator.batch(JobSpec("engagement_activity", stream, predecessors))` around the
attempt; a give-up (lock timeout, wrong predecessor) waits for the stream's next tick.
Uncoordinated: a `CommitFailedError` is a conflict; the batch is re-run at once from a fresh read
of the table, which is how such a run recovers (the txn version makes a retry exactly-once).

Predecessor rules (`RULES`, overridable per Workload), checked on the registration sequence of the coordinated run:
  ingestion  any predecessor
  mutation   {ingestion}: every mutation batch runs directly after an ingestion batch, so mutation
             requests are applied to a table holding the activities ingested just before
             (the reference's `job.coordinator.predecessor=Ingestion`)
  retention  {ingestion, mutation}: never twice in a row (the first registration on a lock is
             always allowed by the coordinator)
A rule naming one stream ties the follower's progress to it: mutation waits while ingestion is
quiet. So in the coordinated run ingestion keeps ticking with empty batches (lock, register,
unlock: outcome "idle") until the other streams are done, as a live ingestion stream would.
Stricter sets can starve a slow stream: with retention {mutation} (or the platform's {mutation,
retention}) and these commensurate cadences, retention kept finding ingestion last and gave up for
the whole 60-120 s deadline in 3 of 6 tries; the rules above finished in every run made so far.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from deltalake.exceptions import CommitFailedError

from benchmarks.three_streams.workload import (
    INGESTION,
    LOCK_NAME,
    MUTATION,
    RETENTION,
    RULES,
    STREAMS,
    StreamConfig,
    Workload,
    apply_batch,
    canonical,
    expected_content,
    seed_rows,
)
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.lake.delta import BatchTxn, DeltaLake

__all__ = [
    "INGESTION",
    "MUTATION",
    "RETENTION",
    "RULES",
    "STREAMS",
    "StreamConfig",
    "Workload",
    "apply_batch",
    "seed_rows",
]

RAN = ("committed", "conflict")  # outcomes whose window did work on the table (idle and gave_up did not)
IDLE_POLL_S = 0.05


@dataclass(frozen=True)
class Window:
    """One attempt of one batch: `start`/`end` in seconds from the run's start."""

    stream: str
    batch: int
    attempt: int
    requested: float  # tick time (before waiting for the lock)
    start: float
    end: float
    outcome: str  # committed | conflict | gave_up | idle | lease_lost
    token: int | None = None
    version: int | None = None
    rows: int = 0
    detail: str = ""


@dataclass
class SimulationResult:
    coordinated: bool
    workload: Workload
    windows: list[Window]
    registrations: list[tuple[str, str, int]]  # (stream, owner, fencing token) in registration order
    elapsed_s: float
    content_matches: bool
    commits_per_batch: dict[str, Counter] = field(default_factory=dict)  # stream -> {batch: commits in history}

    def count(self, outcome: str) -> int:
        return sum(w.outcome == outcome for w in self.windows)

    @property
    def conflicts(self) -> int:
        return self.count("conflict")

    @property
    def gave_up(self) -> int:
        return self.count("gave_up")

    @property
    def overlaps(self) -> int:
        return count_overlaps(self.windows)

    @property
    def committed_rows(self) -> dict[str, int]:
        return {s: sum(w.rows for w in self.windows if w.stream == s and w.outcome == "committed") for s in STREAMS}

    @property
    def exactly_once(self) -> bool:
        """Every batch of every stream is in the table's history exactly once."""
        return all(
            self.commits_per_batch.get(s.name, Counter()) == Counter(range(1, s.batches + 1))
            for s in self.workload.streams
        )

    def order_violations(self) -> list[int]:
        return order_violations([(s, owner) for s, owner, _ in self.registrations], self.workload.rules)

    def summary(self) -> dict:
        batches = sum(w.outcome == "committed" for w in self.windows)
        rows = sum(self.committed_rows.values())
        return {
            "mode": "coordinated" if self.coordinated else "uncoordinated",
            "elapsed_s": round(self.elapsed_s, 2),
            "batches_committed": batches,
            "rows_committed": self.committed_rows,
            "overlaps": self.overlaps,
            "conflicts": self.conflicts,
            "conflicts_by_stream": dict(Counter(w.stream for w in self.windows if w.outcome == "conflict")),
            "conflict_reasons": dict(
                Counter(w.detail.split("Commit failed: ")[-1] for w in self.windows if w.outcome == "conflict")
            ),
            "gave_up": self.gave_up,
            "idle": self.count("idle"),
            "order_violations": len(self.order_violations()) if self.coordinated else None,
            "content_matches": self.content_matches,
            "exactly_once": self.exactly_once,
            "batches_per_s": round(batches / self.elapsed_s, 2),
            "rows_per_s": round(rows / self.elapsed_s, 1),
        }


def count_overlaps(windows: list[Window]) -> int:
    """Pairs of windows of different streams that both worked on the table and overlap in time."""
    ran = sorted((w for w in windows if w.outcome in RAN), key=lambda w: w.start)
    pairs = 0
    for i, a in enumerate(ran):
        for b in ran[i + 1 :]:
            if b.start >= a.end:
                break
            pairs += a.stream != b.stream
    return pairs


def order_violations(sequence: list[tuple[str, str]], rules: dict[str, frozenset[str]]) -> list[int]:
    """Positions of (stream, owner) registrations whose predecessor breaks the stream's rule.

    Written independently of the coordinator's own check, with the same semantics: the first
    registration on a lock is always allowed, and so is a retry of the batch registered last.
    """
    bad = []
    for i, (name, owner) in enumerate(sequence):
        allowed = rules.get(name, frozenset())
        if i and allowed and sequence[i - 1][0] not in allowed and sequence[i - 1] != (name, owner):
            bad.append(i)
    return bad


# ---- the run ------------------------------------------------------------------------------------

CoordinatorFactory = Callable[[], "object"]  # -> streams.coordinator.Coordinator (one ZooKeeper session per stream)


class _Run:
    def __init__(self, lake: DeltaLake, w: Workload, coordinator: CoordinatorFactory | None):
        self.lake, self.w, self.coordinator = lake, w, coordinator
        self.windows: list[Window] = []
        self.registrations: list[tuple[str, int]] = []
        self.mutex = threading.Lock()
        self.done = {s.name: False for s in w.streams}
        self.t0 = 0.0
        self.errors: list[BaseException] = []

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def record(self, window: Window) -> None:
        with self.mutex:
            self.windows.append(window)

    def others_busy(self, name: str) -> bool:
        return not all(done for s, done in self.done.items() if s != name)

    def stream(self, cfg: StreamConfig, ready: threading.Barrier) -> None:
        coord = self.coordinator() if self.coordinator else None
        try:
            if coord:
                coord.start()  # the session opens before the clock starts
            ready.wait()
            batch, attempt, tick = 1, 1, 0.0
            while self.now() < self.w.deadline_s:
                if batch > cfg.batches:
                    self.done[cfg.name] = True
                    if not (coord and cfg.keep_alive and self.others_busy(cfg.name)):
                        return
                delay = tick - self.now()
                if delay > 0:
                    time.sleep(delay)
                outcome = self.attempt(cfg, coord, batch, attempt)
                if outcome == "conflict":
                    if attempt > self.w.max_conflict_retries:
                        raise RuntimeError(f"{cfg.name} batch {batch}: {attempt} conflicts in a row")
                    attempt += 1
                    continue  # recover: re-read the table and re-run the batch now
                if outcome == "committed":
                    batch, attempt = batch + 1, 1
                # An idle stream polls no faster than IDLE_POLL_S (a zero cadence would spin on the lock).
                tick = max(
                    tick + (max(cfg.interval_s, IDLE_POLL_S) if outcome == "idle" else cfg.interval_s), self.now()
                )
        except BaseException as exc:  # noqa: BLE001 - surfaced by run_simulation
            self.errors.append(exc)
            ready.abort()  # a stream that cannot start must not leave the others waiting
        finally:
            self.done[cfg.name] = True
            if coord:
                coord.close()

    def attempt(self, cfg: StreamConfig, coord, batch: int, attempt: int) -> str:
        requested = self.now()
        if coord is None:
            return self.work(cfg, None, batch, attempt, requested)
        from engagement_platform.streams.coordinator import CoordinationGaveUp, JobSpec, LeaseLost

        idle = batch > cfg.batches
        job = JobSpec(LOCK_NAME, cfg.name, self.w.rules[cfg.name])
        try:
            # The owner names the batch (the coordinator's convention), so a retried batch is recognised.
            owner = f"{cfg.name}/{'idle' if idle else batch}"
            with coord.batch(job, owner=owner, timeout_s=self.w.lock_timeout_s) as lease:
                with self.mutex:  # inside the lock, so this list's order is the registration order
                    self.registrations.append((cfg.name, owner, lease.token))
                if idle:
                    t = self.now()
                    self.record(Window(cfg.name, batch, attempt, requested, t, t, "idle", lease.token))
                    return "idle"
                return self.work(cfg, lease, batch, attempt, requested)
        except CoordinationGaveUp as exc:
            self.record(
                Window(cfg.name, batch, attempt, requested, self.now(), self.now(), "gave_up", detail=str(exc)[:200])
            )
            return "gave_up"
        except LeaseLost as exc:
            self.record(
                Window(cfg.name, batch, attempt, requested, self.now(), self.now(), "lease_lost", detail=str(exc)[:200])
            )
            return "gave_up"

    def work(self, cfg: StreamConfig, lease, batch: int, attempt: int, requested: float) -> str:
        start = self.now()
        table = self.lake.table(ENGAGEMENT_ACTIVITY.name)  # the snapshot this attempt computes from
        time.sleep(cfg.compute_s)
        token = lease.token if lease else None
        txn = BatchTxn(f"simulation.{cfg.name}", batch, {"stream": cfg.name, "fencing_token": token})
        try:
            if lease is not None:
                lease.check()  # fencing: a lease lost during compute must not commit
            version, rows = apply_batch(table, self.w, cfg.name, batch, txn)
        except CommitFailedError as exc:
            self.record(
                Window(
                    cfg.name,
                    batch,
                    attempt,
                    requested,
                    start,
                    self.now(),
                    "conflict",
                    token,
                    detail=str(exc).splitlines()[0][:200],
                )
            )
            return "conflict"
        self.record(Window(cfg.name, batch, attempt, requested, start, self.now(), "committed", token, version, rows))
        return "committed"


def run_simulation(
    lake_root: str, workload: Workload = Workload(), coordinator: CoordinatorFactory | None = None
) -> SimulationResult:
    """Seed a fresh table under `lake_root`, run the three streams, check the final content."""
    lake = DeltaLake(lake_root)
    lake.append(ENGAGEMENT_ACTIVITY, seed_rows(workload), BatchTxn("simulation.seed", 0))
    run = _Run(lake, workload, coordinator)
    ready = threading.Barrier(len(workload.streams) + 1)
    threads = [threading.Thread(target=run.stream, args=(cfg, ready), name=cfg.name) for cfg in workload.streams]
    for t in threads:
        t.start()
    run.t0 = time.perf_counter()
    try:
        ready.wait()  # every stream has its ZooKeeper session: start the clock together
        run.t0 = time.perf_counter()
    except threading.BrokenBarrierError:
        pass  # a stream failed to start; its error is raised below
    for t in threads:
        t.join()
    elapsed = run.now()
    if run.errors:
        raise run.errors[0]
    actual = canonical(lake.read(ENGAGEMENT_ACTIVITY.name))
    return SimulationResult(
        coordinated=coordinator is not None,
        workload=workload,
        windows=sorted(run.windows, key=lambda w: (w.start, w.stream)),
        registrations=run.registrations,
        elapsed_s=elapsed,
        content_matches=actual.equals(expected_content(workload)),
        commits_per_batch=_commits_per_batch(lake),
    )


def _commits_per_batch(lake: DeltaLake) -> dict[str, Counter]:
    counts: dict[str, Counter] = {s: Counter() for s in STREAMS}
    for commit in lake.history(ENGAGEMENT_ACTIVITY.name):
        app = str(commit.get("app_id", ""))
        if app.startswith("simulation.") and app != "simulation.seed":
            counts[app.removeprefix("simulation.")][int(commit["batch_id"])] += 1
    return counts


def run_both_modes(zookeeper_hosts: str, workload: Workload = Workload()) -> tuple[SimulationResult, SimulationResult]:
    """Coordinated then uncoordinated, each on a fresh temporary table; the coordinated run uses its
    own ZooKeeper root (deleted afterwards) so it never meets the platform's real lock."""
    import tempfile

    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError

    from engagement_platform.streams.coordinator import Coordinator

    root = f"/engagement_platform_simulation/{uuid.uuid4().hex}"
    try:
        with tempfile.TemporaryDirectory(prefix="ep-simulation-") as d:
            coordinated = run_simulation(f"{d}/on", workload, lambda: Coordinator(zookeeper_hosts, root))
            uncoordinated = run_simulation(f"{d}/off", workload, None)
    finally:
        zk = KazooClient(zookeeper_hosts)
        zk.start(timeout=10)
        try:
            zk.delete(root, recursive=True)
        except NoNodeError:
            pass
        finally:
            zk.stop()
            zk.close()
    return coordinated, uncoordinated
