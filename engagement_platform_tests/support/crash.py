"""Crash tests: a batch run in a child process that a failpoint kills (SIGKILL, exit 137) right after
one table commit, then the same batch run again to completion."""

from __future__ import annotations

import os
import subprocess
import sys

from engagement_platform.streams.batch import FAILPOINT_ENV


def run_batch_process(command: list[str], lake_root: str, failpoint: str | None = None) -> subprocess.CompletedProcess:
    """`python <command>` against the test lake, with the failpoint set (and only then)."""
    env = {**os.environ, "EP_LAKE_ROOT": lake_root}
    env.pop(FAILPOINT_ENV, None)
    if failpoint:
        env[FAILPOINT_ENV] = failpoint
    return subprocess.run([sys.executable, *command], env=env, capture_output=True, text=True, timeout=300)


def crash_then_rerun(command: list[str], lake_root: str, lake, checkpoints, stream: str, app_id: str, batch_id: int,
                     crash_after: str) -> subprocess.CompletedProcess:
    """Kill the batch right after its commit to `crash_after`, check what that left, re-run it; returns the
    re-run, which must have finished the batch and found `crash_after` already committed."""
    crashed = run_batch_process(command, lake_root, failpoint=f"{stream}:after:{crash_after}")
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    assert not checkpoints.is_done(stream, batch_id)
    assert lake.committed_version(crash_after, app_id) == batch_id

    rerun = run_batch_process(command, lake_root)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert checkpoints.is_done(stream, batch_id)
    assert checkpoints.states(stream, batch_id)[crash_after] == "already_committed"
    return rerun
