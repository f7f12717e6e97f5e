"""The forking run launcher on a real Dagster instance: runs start from the pool, finish, cancel, and follow code
changes. The code location is a small module of this package (pool_location.py); no stack is needed."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, DagsterInvariantViolationError, DagsterRunStatus, reconstructable
from dagster._core.launcher import LaunchRunContext

from engagement_platform.orchestration.launcher import (
    WORKER_TAG,
    ForkingRunLauncher,
    live_worker_pid,
    process_start_ticks,
    worker_tag,
)
from engagement_platform.orchestration.run_pool import WORKER_NAME
from engagement_platform_tests.orchestration import pool_location

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def instance(tmp_path: Path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    config = {
        "telemetry": {"enabled": False},
        "run_launcher": {"module": "engagement_platform.orchestration.launcher", "class": "ForkingRunLauncher"},
    }
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    with DagsterInstance.from_config(str(home)) as instance:
        yield instance


def _launch(instance: DagsterInstance, report: Path, wait_s: float = 0.0):
    recon = reconstructable(_job)
    run = instance.create_run_for_job(
        job_def=pool_location.worker_report_job,
        run_config={"ops": {"report_worker": {"config": {"report_path": str(report), "wait_s": wait_s}}}},
        job_code_origin=recon.get_python_origin(),
    )
    instance.run_launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    return run


def _job():
    return pool_location.worker_report_job


def _wait_for(instance: DagsterInstance, run_id: str, statuses: set[DagsterRunStatus], timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.status in statuses:
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} not in {statuses} after {timeout_s} s: {instance.get_run_by_id(run_id)}")


def test_runs_are_forked_from_one_preloaded_server_and_succeed(instance: DagsterInstance, tmp_path: Path) -> None:
    launcher = instance.run_launcher
    assert isinstance(launcher, ForkingRunLauncher)
    reports = [tmp_path / f"report{i}.json" for i in range(3)]
    runs = [_launch(instance, report) for report in reports]
    for run in runs:
        assert _wait_for(instance, run.run_id, {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE}).status == (
            DagsterRunStatus.SUCCESS
        )
    seen = [json.loads(report.read_text()) for report in reports]
    servers = {server.process.pid for server in launcher.pool_servers()}
    assert len(servers) == 1, "three runs of one code location share one pool server"
    assert {worker["ppid"] for worker in seen} == servers, "each worker is a child of the pool server"
    assert len({worker["pid"] for worker in seen}) == 3, "one process per run"
    assert {worker["name"] for worker in seen} == {WORKER_NAME}, "a worker is named so (ps, top, the soak's faults)"
    assert [worker["run_id"] for worker in seen] == [run.run_id for run in runs]
    for run in runs:
        tag = instance.get_run_by_id(run.run_id).tags[WORKER_TAG]
        assert tag.split(":")[1] == str(seen[runs.index(run)]["pid"])
        # The run reports success before its worker process has exited, so give the exit a moment.
        deadline = time.monotonic() + 30.0
        while live_worker_pid(tag, socket.gethostname()) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert live_worker_pid(tag, socket.gethostname()) is None, "a finished worker is not judged alive"


def test_terminate_cancels_the_forked_worker(instance: DagsterInstance, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    run = _launch(instance, report, wait_s=120.0)
    _wait_for(instance, run.run_id, {DagsterRunStatus.STARTED})
    deadline = time.monotonic() + 60
    while not report.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert instance.run_launcher.terminate(run.run_id)
    ended = _wait_for(
        instance, run.run_id, {DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE, DagsterRunStatus.SUCCESS}
    )
    assert ended.status == DagsterRunStatus.CANCELED
    assert not instance.run_launcher.terminate(run.run_id), "an ended run has nothing to terminate"


def test_a_changed_source_file_starts_a_new_pool_server(instance: DagsterInstance, tmp_path: Path) -> None:
    launcher = instance.run_launcher
    first = _launch(instance, tmp_path / "a.json")
    _wait_for(instance, first.run_id, {DagsterRunStatus.SUCCESS})
    (old_server,) = launcher.pool_servers()
    source = Path(pool_location.__file__)
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    try:
        second = _launch(instance, tmp_path / "b.json")
        _wait_for(instance, second.run_id, {DagsterRunStatus.SUCCESS})
    finally:
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (new_server,) = launcher.pool_servers()
    assert new_server.process.pid != old_server.process.pid
    assert json.loads((tmp_path / "b.json").read_text())["ppid"] == new_server.process.pid
    old_server.process.wait(timeout=30)  # the retired server exits once it has no run left


def test_a_changed_file_the_code_location_read_while_loading_starts_a_new_pool_server(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    data = Path(pool_location.__file__).with_name("pool_location.json")
    first = _launch(instance, tmp_path / "a.json")
    _wait_for(instance, first.run_id, {DagsterRunStatus.SUCCESS})
    assert json.loads((tmp_path / "a.json").read_text())["greeting"] == "hello"
    original = data.read_text()
    try:
        data.write_text('{"greeting": "hello again"}\n')
        second = _launch(instance, tmp_path / "b.json")
        _wait_for(instance, second.run_id, {DagsterRunStatus.SUCCESS})
    finally:
        data.write_text(original)
    assert json.loads((tmp_path / "b.json").read_text())["greeting"] == "hello again"


def test_preload_off_launches_through_the_code_server(tmp_path: Path) -> None:
    """With `preload: false` a run goes the default launcher's way, through the code server of a workspace (there is
    none here, so the launch fails saying so) and no pool server starts."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    launcher = {"module": "engagement_platform.orchestration.launcher", "class": "ForkingRunLauncher"}
    config = {"telemetry": {"enabled": False}, "run_launcher": {**launcher, "config": {"preload": False}}}
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    with DagsterInstance.from_config(str(home)) as instance:
        with pytest.raises(DagsterInvariantViolationError, match="requires a workspace"):
            _launch(instance, tmp_path / "report.json")
        assert instance.run_launcher.pool_servers() == []


def test_an_exited_worker_its_parent_has_not_reaped_is_not_judged_alive() -> None:
    host = socket.gethostname()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert live_worker_pid(worker_tag(host, pid, ""), host) is None, "a zombie runs nothing"
        assert live_worker_pid(worker_tag(host, os.getpid(), process_start_ticks(os.getpid())), host) == os.getpid()
    finally:
        os.waitpid(pid, 0)
