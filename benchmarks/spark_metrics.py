"""How much of a benchmark's measured window was Spark task work and how much the driver's alone, from the Spark
Connect application's REST API (the bench stack starts its UI on EP_SPARK_UI_PORT), and what that implies for
more executors.

The model, Amdahl's law with a measured serial part:
- **task seconds**: the `executorRunTime` of every stage that completed in the window, summed over its tasks:
  the work executors do, which more executors share (task CPU seconds: their `executorCpuTime`);
- **serial seconds**: the window's wall time minus the union of the intervals during which at least one Spark job
  ran (overlapping jobs count once, a job's part outside the window not at all). It is everything no executor
  count shortens: the driver's Python (planning batches, reading Kafka watermarks and the lake's logs, committing
  with delta-rs, handing results over) and the Connect server's own work outside a job (analysing and planning the
  query, collecting a result after its job);
- **serial share** = serial / (serial + task);
- time(N) = serial + task / N, and speedup(N) = time(1) / time(N), which never exceeds 1 / serial share.

Its limits: the task part is taken as spread perfectly over N executors: no skew (a batch's slowest task bounds
its job), no per-task fixed cost that grows with N (scheduling, deserialising the task, opening a Python worker),
no shuffle or broadcast that grows with N, and enough tasks per stage to keep N executors busy (a stage of 4 tasks
does not go faster on 8). The gaps inside a running job (the scheduler's and the driver's bookkeeping between its
stages) count as neither part. On a 2-core machine the tasks share the cores with the driver and the broker, so
their seconds include waiting for a core and the prediction for N > 2 is an upper bound. The UI keeps the last
1000 stages and jobs (spark.ui.retainedStages / retainedJobs): a window with more loses its oldest (a warning says
so).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime

EXECUTORS = (2, 8, 32)  # the cluster sizes each benchmark prints a predicted speedup for
RETAINED = 1000  # Spark's default spark.ui.retainedStages and spark.ui.retainedJobs


def union_seconds(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by at least one of the intervals (each clipped to the window)."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if min(b, end) > max(a, start))
    covered, reach = 0.0, start
    for a, b in clipped:
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    return covered


@dataclass(frozen=True)
class Split:
    """A window's wall time split into Spark task work and the driver's serial part."""

    wall_s: float
    task_s: float  # executors' run time of the window's tasks, summed
    task_cpu_s: float  # their CPU time in the executors' JVM threads (a Python worker's CPU is only in task_s)
    jobs_s: float  # wall time during which at least one Spark job ran
    tasks: int
    executor_tasks: tuple[tuple[str, int], ...] = ()  # (executor id, tasks it ran in the window) on a cluster

    @property
    def serial_s(self) -> float:
        return max(0.0, self.wall_s - self.jobs_s)

    @property
    def serial_share(self) -> float:
        total = self.serial_s + self.task_s
        return self.serial_s / total if total else 0.0

    def predicted_s(self, executors: int) -> float:
        """Amdahl: the window's wall time on `executors` executors."""
        return self.serial_s + self.task_s / executors

    def speedup(self, executors: int) -> float:
        """Amdahl: the time on one executor over the time on `executors`, with the measured serial part."""
        return self.predicted_s(1) / self.predicted_s(executors) if self.predicted_s(1) else 1.0

    def line(self) -> str:
        speedups = ", ".join(f"{n}: {self.speedup(n):.2f}x" for n in EXECUTORS)
        per_executor = (
            "; tasks per executor " + ", ".join(f"{e}: {n}" for e, n in self.executor_tasks)
            if self.executor_tasks
            else ""
        )
        return (
            f"{self.task_s:.1f} task s ({self.task_cpu_s:.1f} JVM CPU s, {self.tasks} tasks{per_executor}) and "
            f"{self.serial_s:.1f} s serial on the driver (no Spark job running) of {self.wall_s:.1f} s: serial share "
            f"{self.serial_share:.0%}; Amdahl speedup over one executor for {speedups}"
        )

    def figures(self, prefix: str = "") -> dict[str, float]:
        return {
            f"{prefix}task_s": round(self.task_s, 1),
            f"{prefix}task_cpu_s": round(self.task_cpu_s, 1),
            f"{prefix}driver_serial_s": round(self.serial_s, 1),
            f"{prefix}serial_share": round(self.serial_share, 3),
            **{f"{prefix}amdahl_speedup_{n}": round(self.speedup(n), 2) for n in EXECUTORS},
        }


def spark_time(text: str) -> float:
    """Epoch seconds of the REST API's times ("2026-11-28T18:40:43.123GMT")."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fGMT").replace(tzinfo=UTC).timestamp()


@dataclass(frozen=True)
class Snapshot:
    at: float  # epoch seconds (the clock the REST API's times are on) when the window starts
    stages: frozenset[tuple[int, int]]  # (stage id, attempt id) of the completed stages
    jobs: frozenset[int]  # the finished jobs
    executor_tasks: tuple[tuple[str, int], ...]  # (executor id, tasks run so far)


class SparkMetrics:
    """The Connect application's completed stages and jobs, read from its UI's REST API on 127.0.0.1:`port`."""

    def __init__(self, port: int | str):
        self.base = f"http://127.0.0.1:{port}/api/v1/applications"

    def get(self, path: str):
        with urllib.request.urlopen(f"{self.base}{path}", timeout=30) as answer:
            return json.load(answer)

    def app(self) -> str:
        (app,) = self.get("")
        return app["id"]

    def executor_tasks(self, app: str | None = None) -> tuple[tuple[str, int], ...]:
        """(executor id, tasks it ran) of every executor the application had, the driver included."""
        return tuple((e["id"], e["totalTasks"]) for e in self.get(f"/{app or self.app()}/allexecutors"))

    def wait_for_executors(self, count: int, timeout: float = 60.0) -> int:
        """Wait until `count` executors besides the driver are active (a standalone cluster's register on their
        own time); returns how many there are."""
        deadline = time.monotonic() + timeout
        while True:
            active = [e for e in self.get(f"/{self.app()}/executors") if e["id"] != "driver"]
            if len(active) >= count or time.monotonic() > deadline:
                return len(active)
            time.sleep(0.5)

    def snapshot(self) -> Snapshot:
        """The state the window starts from: take it just before the measured run."""
        app = self.app()
        stages = self.get(f"/{app}/stages?status=complete")
        jobs = self.get(f"/{app}/jobs")
        executors = self.executor_tasks(app)
        return Snapshot(
            time.time(),
            frozenset((s["stageId"], s["attemptId"]) for s in stages),
            frozenset(j["jobId"] for j in jobs if j.get("completionTime")),
            executors,
        )

    def split_since(self, before: Snapshot, settle: float = 10.0) -> Split:
        """The split of the window from `before` until now (every stage and job that completed in it): call it
        right after the measured run. The UI learns of a finished job from an event queue, a moment after the
        action returned to the client: wait (up to `settle` s) until it knows of no running job."""
        end = time.time()
        app = self.app()
        deadline = time.monotonic() + settle
        while self.get(f"/{app}/jobs?status=running") and time.monotonic() < deadline:
            time.sleep(0.2)
        all_stages = self.get(f"/{app}/stages?status=complete")
        all_jobs = self.get(f"/{app}/jobs")
        if len(all_stages) >= RETAINED or len(all_jobs) >= RETAINED:
            print(
                f"spark_metrics: the UI retains {len(all_stages)} stages and {len(all_jobs)} jobs, its limit: the "
                "window's oldest may be missing from the task seconds",
                file=sys.stderr,
            )
        stages = [s for s in all_stages if (s["stageId"], s["attemptId"]) not in before.stages]
        jobs = [j for j in all_jobs if j.get("completionTime") and j["jobId"] not in before.jobs]
        intervals = [(spark_time(j["submissionTime"]), spark_time(j["completionTime"])) for j in jobs]
        earlier = dict(before.executor_tasks)
        ran = tuple(  # the executors of a cluster; on local[N] the driver runs every task and none is listed
            (e, n - earlier.get(e, 0))
            for e, n in self.executor_tasks(app)
            if e != "driver" and n - earlier.get(e, 0) > 0
        )
        return Split(
            wall_s=end - before.at,
            task_s=sum(s["executorRunTime"] for s in stages) / 1e3,
            task_cpu_s=sum(s["executorCpuTime"] for s in stages) / 1e9,
            jobs_s=union_seconds(intervals, before.at, end),
            tasks=sum(s["numCompleteTasks"] for s in stages),
            executor_tasks=ran,
        )
