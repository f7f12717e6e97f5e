"""How much of a benchmark's measured window was Spark task work and how much the driver's alone, from the Spark
Connect application's REST API (the bench stack starts its UI on EP_SPARK_UI_PORT), and what that implies for
more executors.

The model, Amdahl's law with a measured serial part:
- **task seconds**: the `executorRunTime` of every stage that completed in the window, summed over its tasks:
  the work executors do, which more executors share;
- **serial seconds**: the window's wall time during which no Spark job ran: the driver planning, reading Kafka
  watermarks and the lake's logs, committing with delta-rs, handing results over. More executors do not shorten it;
- time(N) = serial + task / N, and speedup(N) = time(1) / time(N).

Its limits: the task part is taken as spread perfectly over N executors (no skew, no per-task fixed cost that grows
with N, no shuffle that grows with N); the scheduling gaps inside a running job count as neither part; on this
2-core machine the tasks share the cores with the driver, so their seconds include waiting for a core.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime

EXECUTORS = (2, 8, 32)  # the cluster sizes each benchmark prints a predicted speedup for


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

    @property
    def serial_s(self) -> float:
        return max(0.0, self.wall_s - self.jobs_s)

    @property
    def serial_share(self) -> float:
        total = self.serial_s + self.task_s
        return self.serial_s / total if total else 0.0

    def speedup(self, executors: int) -> float:
        """Amdahl: the time on one executor over the time on `executors`, with the measured serial part."""
        one = self.serial_s + self.task_s
        return one / (self.serial_s + self.task_s / executors) if one else 1.0

    def line(self) -> str:
        speedups = ", ".join(f"{n}: {self.speedup(n):.2f}x" for n in EXECUTORS)
        return (
            f"{self.task_s:.1f} task s ({self.task_cpu_s:.1f} JVM CPU s, {self.tasks} tasks) and {self.serial_s:.1f} s serial "
            f"on the driver (no Spark job running) of {self.wall_s:.1f} s: serial share {self.serial_share:.0%}; "
            f"Amdahl speedup over one executor for {speedups}"
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
    at: float
    stages: frozenset[tuple[int, int]]  # (stage id, attempt id) of the completed stages
    jobs: frozenset[int]


class SparkMetrics:
    """The Connect application's completed stages and jobs, read from its UI's REST API on 127.0.0.1:`port`."""

    def __init__(self, port: int | str):
        self.base = f"http://127.0.0.1:{port}/api/v1/applications"

    def _get(self, path: str):
        with urllib.request.urlopen(f"{self.base}{path}", timeout=30) as answer:
            return json.load(answer)

    def _app(self) -> str:
        (app,) = self._get("")
        return app["id"]

    def snapshot(self) -> Snapshot:
        import time

        app = self._app()
        stages = self._get(f"/{app}/stages?status=complete")
        jobs = self._get(f"/{app}/jobs")
        return Snapshot(
            time.time(),
            frozenset((s["stageId"], s["attemptId"]) for s in stages),
            frozenset(j["jobId"] for j in jobs if j.get("completionTime")),
        )

    def split_since(self, before: Snapshot) -> Split:
        """The split of the window from `before` until now (every stage and job that completed in it)."""
        import time

        end = time.time()
        app = self._app()
        stages = [
            s
            for s in self._get(f"/{app}/stages?status=complete")
            if (s["stageId"], s["attemptId"]) not in before.stages
        ]
        jobs = [j for j in self._get(f"/{app}/jobs") if j.get("completionTime") and j["jobId"] not in before.jobs]
        intervals = [(spark_time(j["submissionTime"]), spark_time(j["completionTime"])) for j in jobs]
        return Split(
            wall_s=end - before.at,
            task_s=sum(s["executorRunTime"] for s in stages) / 1e3,
            task_cpu_s=sum(s["executorCpuTime"] for s in stages) / 1e9,
            jobs_s=union_seconds(intervals, before.at, end),
            tasks=sum(s["numCompleteTasks"] for s in stages),
        )
