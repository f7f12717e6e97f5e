"""The benchmarks' split of a run into Spark task work and the driver's serial part (benchmarks/spark_metrics.py):
the union of job intervals within a window, and Amdahl's law with the measured serial part."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.spark_metrics import Split, spark_time, union_seconds


def covered_by_steps(intervals, start, end, step=0.01) -> float:
    """The obviously correct reference: walk the window in small steps, count those inside some interval."""
    steps = round((end - start) / step)
    inside = sum(any(a <= start + (i + 0.5) * step < b for a, b in intervals) for i in range(steps))
    return inside * step


def test_overlapping_jobs_count_once_and_a_job_outside_the_window_not_at_all():
    jobs = [(1.0, 3.0), (2.0, 4.0), (6.0, 7.0), (20.0, 30.0), (-5.0, 0.5)]
    assert union_seconds(jobs, 0.0, 10.0) == pytest.approx(2.0 + 1.0 + 0.5 + 1.0)
    assert union_seconds([], 0.0, 10.0) == 0.0


@given(
    st.lists(
        st.tuples(st.integers(-20, 120), st.integers(0, 60)).map(lambda t: (t[0] / 10, (t[0] + t[1]) / 10)),
        max_size=8,
    )
)
def test_union_matches_a_walk_over_the_window(intervals):
    assert union_seconds(intervals, 0.0, 10.0) == pytest.approx(covered_by_steps(intervals, 0.0, 10.0), abs=1e-6)


def test_amdahl_with_the_measured_serial_part():
    split = Split(wall_s=10.0, task_s=16.0, task_cpu_s=12.0, jobs_s=8.0, tasks=4)
    assert split.serial_s == pytest.approx(2.0)
    assert split.serial_share == pytest.approx(2.0 / 18.0)
    assert split.speedup(1) == pytest.approx(1.0)
    assert split.speedup(2) == pytest.approx(18.0 / 10.0)
    assert split.speedup(8) == pytest.approx(18.0 / 4.0)
    assert split.speedup(32) < 1 / split.serial_share  # never past Amdahl's bound
    figures = split.figures("cluster_")
    assert figures["cluster_driver_serial_s"] == 2.0 and figures["cluster_amdahl_speedup_2"] == 1.8


def test_a_window_with_jobs_running_all_along_has_no_serial_part():
    split = Split(wall_s=5.0, task_s=9.0, task_cpu_s=9.0, jobs_s=5.2, tasks=2)
    assert split.serial_s == 0.0 and split.serial_share == 0.0 and split.speedup(8) == pytest.approx(8.0)


def test_the_rest_apis_times_are_utc():
    assert spark_time("1970-01-01T00:01:00.500GMT") == pytest.approx(60.5)


def test_the_predicted_time_and_the_printed_line():
    split = Split(wall_s=10.0, task_s=16.0, task_cpu_s=12.0, jobs_s=8.0, tasks=4, executor_tasks=(("0", 3), ("1", 1)))
    assert split.predicted_s(1) == pytest.approx(18.0) and split.predicted_s(8) == pytest.approx(4.0)
    line = split.line()
    assert "16.0 task s" in line and "2.0 s serial" in line and "serial share 11%" in line
    assert "tasks per executor 0: 3, 1: 1" in line and "2: 1.80x" in line
    assert "tasks per executor" not in Split(wall_s=1.0, task_s=1.0, task_cpu_s=1.0, jobs_s=1.0, tasks=1).line()
