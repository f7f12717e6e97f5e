"""A crash of the whole Dagster host while an ingestion run is in flight strands nothing.

`dagster dev` runs in a process group of its own (webserver, daemon, code server, run worker); once the
ingestion run is STARTED every one of those processes is SIGKILLed at once, as a host crash or an OOM kill
of the group would. `dagster dev` is started again on the same DAGSTER_HOME: the ingestion sensor finds the
run STARTED with no liveness node in ZooKeeper, fails it (tagged orphaned) after the bound, and requests the
batch again; the batch is committed exactly once (engagement_activity compared with what Kafka holds), no
ingestion run stays STARTED, and the retry reports how long the batch was stranded."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from engagement_platform.engagement.ingestion.apply import STREAM
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.orchestration.orphans import ORPHANED_TAG, STRANDED_METADATA
from engagement_platform_tests.support.activities import produce_activities
from engagement_platform_tests.support.stack import REPO

JOB = "engagement_ingestion_job"
ORPHAN_AFTER_S = 10
RECOVERY_S = 150  # from the second `dagster dev`'s start to the batch committed (the issue's bound is 2 minutes + start-up)
IN_FLIGHT = {DagsterRunStatus.STARTING, DagsterRunStatus.STARTED}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_dagster(home: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([str(REPO / ".venv" / "bin" / "dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(free_port())],
                                cwd=REPO, env={**env, "DAGSTER_HOME": str(home)}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group, as `set -m` gives run_platform.sh


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (a run worker may sit in another process group), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL `dagster dev`, its process group and every process below it, at once; then reap."""
    pids = descendants(proc.pid) | {proc.pid}
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def ingestion_runs(instance: DagsterInstance):
    return instance.get_runs(filters=RunsFilter(job_name=JOB))


def wait_for(what: str, condition, timeout_s: float, on_timeout=lambda: ""):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s:g}s: {what}. {on_timeout()}")


def test_a_run_orphaned_by_a_host_crash_is_failed_and_its_batch_committed_once(stack, kafka, topic, lake_root, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "EP_ORPHAN_AFTER_SECONDS": str(ORPHAN_AFTER_S), "EP_LANDING_ROOT": str(tmp_path / "landing"),
           "EP_PROFILE_CDC_TOPIC": f"{topic}.cdc", "EP_MUTATIONS_TOPIC": f"{topic}.mutations", "EP_GDPR_TOPIC": f"{topic}.gdpr"}
    log = tmp_path / "dagster.log"
    expected = produce_activities(kafka, topic, 3000)
    checkpoints = CheckpointStore(DeltaLake(lake_root))
    first = second = None
    try:
        first = start_dagster(home, env, log)
        with DagsterInstance.from_config(str(home)) as instance:
            started = wait_for("an ingestion run STARTED", lambda: next((r for r in ingestion_runs(instance) if r.status == DagsterRunStatus.STARTED), None),
                               240, lambda: log.read_text()[-3000:])
            kill_all(first)
            first = None
            crashed = instance.get_run_by_id(started.run_id)
            assert crashed.status == DagsterRunStatus.STARTED, f"the crash came too late to strand the run: {crashed.status}"

            restarted_at = time.monotonic()
            second = start_dagster(home, env, log)

            def committed():
                plan, done = checkpoints.latest(STREAM)
                runs = ingestion_runs(instance)
                return plan is not None and done and plan.ends() == {p: h for p, (_, h) in kafka.watermarks(topic).items()} and not any(r.status in IN_FLIGHT for r in runs)

            wait_for("the stranded batch committed and no ingestion run in flight", committed, RECOVERY_S,
                     lambda: f"runs: {[(r.run_id[:8], r.status.value) for r in ingestion_runs(instance)]}; log: {log.read_text()[-3000:]}")
            recovered_s = time.monotonic() - restarted_at

            orphan = instance.get_run_by_id(started.run_id)
            assert orphan.status == DagsterRunStatus.FAILURE and orphan.tags.get(ORPHANED_TAG) == "true"
            assert not [r for r in instance.get_runs(filters=RunsFilter(job_name=JOB, statuses=list(IN_FLIGHT)))]
            retries = [r for r in ingestion_runs(instance) if r.status == DagsterRunStatus.SUCCESS
                       and r.tags.get("dagster/partition") == crashed.tags["dagster/partition"]]
            assert retries, "the batch was retried and the retry succeeded"
            (materialization,) = [e.asset_materialization for e in instance.get_records_for_run(retries[0].run_id).records
                                  if e.asset_materialization is not None and e.asset_materialization.asset_key.to_user_string() == "engagement_ingestion"]
            stranded = materialization.metadata[STRANDED_METADATA].value
            assert ORPHAN_AFTER_S <= stranded <= recovered_s + 240, stranded
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                kill_all(proc)

    rows = DeltaLake(lake_root).read(ENGAGEMENT_ACTIVITY.name).to_pylist()
    assert Counter(r["engagement_id"] for r in rows) == Counter(expected.keys()), "each produced activity exactly once"
    for row in rows:
        src = expected[row["engagement_id"]]
        assert (row["org_id"], row["activity_type"], row["lead_id"]) == (src["org_id"], src["activity_type"], src["lead_id"])
