"""The one crash-test harness: a batch run by `engagement-platform run-batch` in a child process that a
failpoint kills (exit 137, no cleanup: the closest thing to SIGKILL) right after one table commit, then
the same batch run again to completion."""

from __future__ import annotations

import os
import subprocess
import sys

from engagement_platform.streams.batch import FAILPOINT_ENV

KILLED = 137  # the failpoint's exit code


def after_commit(stream: str, table: str) -> str:
    """The failpoint that kills `stream`'s batch right after its commit to `table`."""
    return f"{stream}:after:{table}"


def run_batch(
    stream: str, lake_root: str, batch_id: int | None = None, *options: str, failpoint: str | None = None
) -> subprocess.CompletedProcess:
    """`python -m engagement_platform.cli run-batch --stream ... [--batch-id ...] [options]` against the
    test lake (the stack's servers come from the environment the `stack` fixture set), with the failpoint
    set (and only then)."""
    command = [sys.executable, "-m", "engagement_platform.cli", "run-batch", "--stream", stream]
    if batch_id is not None:
        command += ["--batch-id", str(batch_id)]
    env = {**os.environ, "EP_LAKE_ROOT": lake_root}
    env.pop(FAILPOINT_ENV, None)
    if failpoint:
        env[FAILPOINT_ENV] = failpoint
    return subprocess.run([*command, *options], env=env, capture_output=True, text=True, timeout=300)


def killed_at(stream: str, lake_root: str, batch_id: int, step: str) -> subprocess.CompletedProcess:
    """Run the batch with the failpoint after `step` (a table commit, or a stream's own step such as the
    executors' file writes) and check that it died there."""
    crashed = run_batch(stream, lake_root, batch_id, failpoint=after_commit(stream, step))
    assert crashed.returncode == KILLED, crashed.stderr[-2000:]
    return crashed


def finished(stream: str, lake_root: str, batch_id: int) -> subprocess.CompletedProcess:
    """Run the batch to the end (a re-run) and check that it succeeded."""
    rerun = run_batch(stream, lake_root, batch_id)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    return rerun


def crash_then_rerun(
    lake_root: str, lake, checkpoints, stream: str, app_id: str, batch_id: int, crash_after: str
) -> subprocess.CompletedProcess:
    """Kill the batch right after its commit to `crash_after`, check what that left, re-run it; returns the
    re-run, which must have finished the batch and found `crash_after` already committed."""
    killed_at(stream, lake_root, batch_id, crash_after)
    assert not checkpoints.is_done(stream, batch_id)
    assert lake.committed_version(crash_after, app_id) == batch_id

    rerun = finished(stream, lake_root, batch_id)
    assert checkpoints.is_done(stream, batch_id)
    assert checkpoints.states(stream, batch_id)[crash_after] == "already_committed"
    return rerun
