"""Where the soak's run slots went: from the Dagster instance's run records, how long runs waited in the run queue,
how much of that wait was behind full slots, and how the slots' time split between runs that succeeded and runs
that failed (killed, orphaned, riding out a fault until it gave up). Recovery at two faults at a time is mostly
queueing (BENCHMARKS.md, "Where the dense runs' recovery time goes"): these figures say whether a change moved it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class RunSpan:
    """One run, in epoch seconds: requested (created), launched (took a slot: STARTING), ended (left it)."""

    created: float
    launched: float | None  # None: never left the queue
    ended: float | None  # None: still in flight when read
    succeeded: bool


@dataclass(frozen=True)
class SlotUsage:
    slots: int
    queued_s: float  # time with at least one run waiting in the queue
    queued_full_s: float  # of which every slot was taken
    waits: list[float]  # per launched run: request -> launch
    success_s: float  # slot time of runs that succeeded
    failed_s: float  # slot time of runs that did not
    successes: int
    failures: int

    def lines(self) -> list[str]:
        share = self.failed_s / (self.success_s + self.failed_s) if self.success_s + self.failed_s else 0.0
        wait = (
            f"median {statistics.median(self.waits):.0f} s, mean {statistics.mean(self.waits):.0f} s"
            if self.waits
            else "none launched"
        )
        return [
            f"run slots {self.slots}: a run waited in the queue for {self.queued_s:.0f} s of the run, all slots taken for "
            f"{self.queued_full_s:.0f} s of those; request to launch {wait}",
            f"slot time: {self.successes} successful runs {self.success_s:.0f} s, {self.failures} failed runs {self.failed_s:.0f} s "
            f"({share:.0%} of all)",
        ]


def slot_usage(runs: list[RunSpan], slots: int, now: float) -> SlotUsage:
    """Sweeps the runs' moments in order: between two moments the number queued and the number holding a slot is
    constant. A run still queued or in flight counts until `now`."""

    def until(moment: float | None) -> float:
        return now if moment is None else moment

    moments = sorted({m for r in runs for m in (r.created, r.launched, r.ended) if m is not None} | {now})
    queued_s = queued_full_s = 0.0
    for begin, end in zip(moments, moments[1:]):
        if not any(
            r.created <= begin < min(until(r.launched), until(r.ended)) for r in runs
        ):  # ended unlaunched: cancelled
            continue
        holding = sum(1 for r in runs if r.launched is not None and r.launched <= begin < until(r.ended))
        queued_s += end - begin
        queued_full_s += (end - begin) if holding >= slots else 0.0
    held = [(r, until(r.ended) - r.launched) for r in runs if r.launched is not None]
    return SlotUsage(
        slots=slots,
        queued_s=queued_s,
        queued_full_s=queued_full_s,
        waits=[r.launched - r.created for r in runs if r.launched is not None],
        success_s=sum(t for r, t in held if r.succeeded),
        failed_s=sum(t for r, t in held if not r.succeeded),
        successes=sum(1 for r, _ in held if r.succeeded),
        failures=sum(1 for r, _ in held if not r.succeeded),
    )


def run_spans(instance) -> list[RunSpan]:
    """Every run of the instance as a RunSpan: launched at its STARTING event (the queue's dequeue), else its start."""
    spans = []
    for record in instance.get_run_records():
        stats = instance.get_run_stats(record.dagster_run.run_id)
        launched = stats.launch_time or stats.start_time or record.start_time
        ended = record.end_time or stats.end_time
        spans.append(
            RunSpan(record.create_timestamp.timestamp(), launched, ended, record.dagster_run.status.value == "SUCCESS")
        )
    return spans


def max_concurrent_runs(instance) -> int:
    queue = instance.get_concurrency_config().run_queue_config
    return queue.max_concurrent_runs if queue is not None else 0
