"""What the platform's control plane costs on its own: per run, per idle sensor tick, and idle.

    .venv/bin/python benchmarks/control_plane.py [--runs 20] [--ticks 10] [--idle-minutes 10]

Three measures, in one run (the last two with the stack up: ZooKeeper, the broker, Spark Connect, topics made):

1. Runs (no stack needed).

Per-run overhead is everything a run pays besides its stream's code: starting the worker process, loading the
definitions, Dagster's run start and end events, teardown. The run here is the platform's code location with one
step that does nothing (benchmarks/control_plane_location.py), launched on a real Dagster instance (SQLite in a
temporary DAGSTER_HOME), one run at a time, each measured from the launch until its worker process has exited:

  pool      : the platform's launcher (ForkingRunLauncher, preload on): the worker is forked from a server that
              imported the code location once (its own start is reported apart, paid once per code change).
  baseline  : a new interpreter per run running the same command (`python -m dagster api execute_run`), which is
              what a run started by a code server is (the server spawns one); the code server's own work is
              not counted, so the ratio understates the saving.

CPU of a worker is exact, not sampled: a forked worker's CPU is read from the pool server's reaped-children
account (/proc/<pid>/stat cutime + cstime) once it has been reaped, a baseline worker's from this process's own
(getrusage RUSAGE_CHILDREN). The launching side's CPU (this process: building the run's arguments, tags and an
engine event) is reported apart.

2. Idle sensor ticks: every sensor of the platform evaluated in this process on a fresh instance, against a lake
whose checkpoint table holds `--seed-batches` done batches of each Kafka stream (empty topics: nothing to do), `--ticks` times after a first one; CPU ms of a tick (median, this process's CPU: it
includes the threads delta-rs and librdkafka run for it) and the asset events it returns (each one a write to
the event log by the daemon). The baseline, in the same run: the same ticks with the process's table cache
cleared before each one, as a tick read its tables before the cache.

3. The idle platform: a persistent code server and `dagster-daemon run` (the platform's dagster.yaml) beside the
stack, no traffic, for `--idle-minutes`: cores busy by process class (sampled /proc of every process that holds the
stack's EP_STATE_DIR, started after a 60 s settle).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stack import bench_stack  # noqa: E402
from record import invocation, record_result  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of a live process."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (utime + stime) / CLOCK_TICKS, (cutime + cstime) / CLOCK_TICKS


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_reaped(pid: int, timeout_s: float = 300.0) -> None:
    """Until the worker is gone from the process table (exited and reaped by the pool server)."""
    deadline = time.monotonic() + timeout_s
    while os.path.exists(f"/proc/{pid}"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker {pid} still there after {timeout_s} s")
        time.sleep(0.01)


def make_instance(home: Path, preload: bool):
    import yaml
    from dagster import DagsterInstance

    home.mkdir(parents=True, exist_ok=True)
    launcher = {
        "module": "engagement_platform.orchestration.launcher",
        "class": "ForkingRunLauncher",
        "config": {"preload": preload},
    }
    (home / "dagster.yaml").write_text(yaml.safe_dump({"telemetry": {"enabled": False}, "run_launcher": launcher}))
    return DagsterInstance.from_config(str(home))


def new_run(instance):
    from dagster import reconstructable

    from benchmarks.control_plane_location import control_plane_noop_job

    recon = reconstructable(control_plane_noop_job)
    return instance.create_run_for_job(job_def=control_plane_noop_job, job_code_origin=recon.get_python_origin())


def check_succeeded(instance, run_id: str) -> None:
    from dagster import DagsterRunStatus

    run = instance.get_run_by_id(run_id)
    if run is None or run.status != DagsterRunStatus.SUCCESS:
        raise RuntimeError(f"run {run_id} ended {run.status if run else 'missing'}")


def measure_pool(home: Path, runs: int) -> dict[str, float | list[float]]:
    from dagster._core.launcher import LaunchRunContext

    from engagement_platform.orchestration.launcher import WORKER_TAG

    instance = make_instance(home, preload=True)
    launcher = instance.run_launcher
    cpu, wall, launching = [], [], []
    server_start_s = server_cpu_s = 0.0
    for index in range(runs + 1):  # the first run starts the pool server; it is reported apart
        run = new_run(instance)
        t0, c0 = time.perf_counter(), time.process_time()
        servers = launcher.pool_servers()
        before = proc_cpu(servers[0].process.pid)[1] if servers else 0.0
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
        launched_c = time.process_time() - c0
        pid = int(instance.get_run_by_id(run.run_id).tags[WORKER_TAG].split(":")[1])
        (server,) = launcher.pool_servers()
        wait_reaped(pid)
        elapsed = time.perf_counter() - t0
        check_succeeded(instance, run.run_id)
        own, reaped = proc_cpu(server.process.pid)
        if index == 0:
            server_start_s, server_cpu_s = elapsed, own
            continue
        cpu.append(reaped - before)
        wall.append(elapsed)
        launching.append(launched_c)
    launcher.dispose()
    instance.dispose()
    return {
        "cpu": cpu,
        "wall": wall,
        "launching": launching,
        "server_start_s": server_start_s,
        "server_cpu_s": server_cpu_s,
    }


def measure_baseline(home: Path, runs: int) -> dict[str, float | list[float]]:
    from dagster import serialize_value
    from dagster._grpc.types import ExecuteRunArgs

    instance = make_instance(home, preload=False)
    cpu, wall = [], []
    for _ in range(runs):
        run = new_run(instance)
        args = ExecuteRunArgs(job_origin=run.job_code_origin, run_id=run.run_id, instance_ref=instance.get_ref())
        env = {**os.environ, "DAGSTER_EXECUTE_RUN_ARGS": serialize_value(args)}
        t0, c0 = time.perf_counter(), children_cpu()
        subprocess.run(
            [sys.executable, "-m", "dagster", "api", "execute_run"], env=env, cwd=REPO, check=True, capture_output=True
        )
        wall.append(time.perf_counter() - t0)
        cpu.append(children_cpu() - c0)
        check_succeeded(instance, run.run_id)
    instance.dispose()
    return {"cpu": cpu, "wall": wall}


def evaluate_ticks(instance, defs, ticks: int, cold: bool) -> dict[str, dict[str, float]]:
    """sensor -> {cpu_ms: median CPU of a tick after the first, events: asset events per such tick}."""
    from dagster import build_sensor_context

    from engagement_platform.lake.table_cache import TABLES
    from engagement_platform.resources import platform_resources

    resources = platform_resources()

    out: dict[str, dict[str, float]] = {}
    for sensor in defs.get_repository_def().sensor_defs:
        cursor = None
        cpu, events = [], []
        for index in range(ticks + 1):
            if cold:
                TABLES.clear()
            c0 = time.process_time()
            try:  # resources set up and torn down around the evaluation, as the daemon's tick does
                with build_sensor_context(
                    instance=instance, cursor=cursor, definitions=defs, sensor_name=sensor.name, resources=resources
                ) as context:
                    data = sensor.evaluate_tick(context)
            except Exception as error:  # noqa: BLE001 - a sensor that cannot tick here is reported, not fatal
                out[sensor.name] = {"error": str(error)[:200]}  # type: ignore[dict-item]
                break
            spent = time.process_time() - c0
            cursor = data.cursor if data.cursor is not None else cursor
            if index > 0:  # the first tick of a process fills its caches and clients
                cpu.append(spent * 1000)
                events.append(len(data.asset_events or []) + len(getattr(data, "asset_check_evaluations", None) or []))
        else:
            out[sensor.name] = {"cpu_ms": round(statistics.median(cpu), 1), "events": statistics.mean(events)}
    return out


# The Kafka streams, their topics and partitions (the topics `create-topics` makes).
SEEDED_STREAMS = (
    ("ingestion", "engagement.activities", 3),
    ("mutation", "engagement.mutations", 3),
    ("retention", "engagement.gdpr", 1),
    ("profile_cdc", "profile.cdc", 3),
    ("profile_erasure", "profile.erasure", 1),
)


def seed_checkpoints(batches: int) -> None:
    """A checkpoint table with a history: `batches` done batches per Kafka stream, each a commit of its plan and one
    of its done state, ending at the (empty) topics' watermarks, so that a tick finds nothing to do."""
    from engagement_platform.lake.checkpoints import CheckpointStore
    from engagement_platform.lake.delta import DeltaLake
    from engagement_platform.settings import load_settings
    from engagement_platform.streams.kafka import OffsetRange
    from engagement_platform.streams.planning import BatchPlan
    from engagement_platform.streams.slices import KafkaSlice

    store = CheckpointStore(DeltaLake(load_settings().lake_root))
    for batch in range(1, batches + 1):
        for stream, topic, partitions in SEEDED_STREAMS:
            plan = BatchPlan(stream, batch, KafkaSlice(topic, tuple(OffsetRange(p, 0, 0) for p in range(partitions))))
            store.record_plan(plan)
            store.mark_done(plan)


def measure_ticks(home: Path, ticks: int, seed_batches: int) -> dict[str, dict[str, dict[str, float]]]:
    from engagement_platform.definitions import defs

    subprocess.run([sys.executable, "-m", "engagement_platform.cli", "create-topics"], cwd=REPO, check=True)
    seed_checkpoints(seed_batches)
    instance = make_instance(home, preload=True)
    warm = evaluate_ticks(instance, defs, ticks, cold=False)
    cold = evaluate_ticks(instance, defs, ticks, cold=True)
    instance.dispose()
    return {"warm": warm, "cold": cold}


def measure_idle(state_dir: str, minutes: float) -> dict[str, float]:
    """Cores busy by process class while the stack and Dagster's daemon and code server idle."""
    from benchmarks._stack import processes_of
    from benchmarks.demo_health import process_cpu
    from benchmarks.soak.faults import Daemon

    home = Path(state_dir) / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    logs = Path(state_dir) / "logs"
    logs.mkdir(exist_ok=True)
    daemon = Daemon({**os.environ, "DAGSTER_HOME": str(home)}, logs / "dagster-daemon.log")
    daemon.start()
    try:
        time.sleep(60)  # the daemon's first ticks, the code server's first snapshot
        first = process_cpu(processes_of(state_dir))
        t0 = time.monotonic()
        time.sleep(minutes * 60)
        elapsed = time.monotonic() - t0
        last = process_cpu(processes_of(state_dir))
    finally:
        daemon.stop()
    cores: dict[str, float] = {}
    for pid, (kind, seconds) in last.items():
        before = first.get(pid, (kind, 0.0))[1]
        cores[kind] = cores.get(kind, 0.0) + (seconds - before) / elapsed
    return {kind: round(value, 3) for kind, value in sorted(cores.items(), key=lambda kv: -kv[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs measured per mode (medians reported)")
    parser.add_argument("--ticks", type=int, default=10, help="idle ticks measured per sensor and mode")
    parser.add_argument("--seed-batches", type=int, default=100, help="done batches per Kafka stream in the lake")
    parser.add_argument("--idle-minutes", type=float, default=10.0, help="how long the idle platform is sampled")
    args = parser.parse_args()
    os.chdir(REPO)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ep-control-plane-") as folder:
        baseline = measure_baseline(Path(folder) / "baseline", args.runs)
        pool = measure_pool(Path(folder) / "pool", args.runs)
        with bench_stack("control-plane", servers=("zookeeper", "kafka", "spark")) as stack_env:
            ticks = measure_ticks(Path(folder) / "ticks", args.ticks, args.seed_batches)
            idle = measure_idle(stack_env["EP_STATE_DIR"], args.idle_minutes) if args.idle_minutes > 0 else {}
    median = statistics.median
    result = {
        "pool_run_cpu_s": round(median(pool["cpu"]), 3),
        "pool_run_wall_s": round(median(pool["wall"]), 3),
        "pool_launch_side_cpu_s": round(median(pool["launching"]), 3),
        "pool_server_start_s": round(pool["server_start_s"], 2),
        "pool_server_own_cpu_s": round(pool["server_cpu_s"], 2),
        "baseline_run_cpu_s": round(median(baseline["cpu"]), 3),
        "baseline_run_wall_s": round(median(baseline["wall"]), 3),
    }
    result["cpu_ratio_baseline_over_pool"] = round(result["baseline_run_cpu_s"] / result["pool_run_cpu_s"], 1)
    result["wall_ratio_baseline_over_pool"] = round(result["baseline_run_wall_s"] / result["pool_run_wall_s"], 1)
    ticked = [name for name, figures in ticks["warm"].items() if "cpu_ms" in figures]
    if ticked:
        result["idle_tick_cpu_ms_max"] = max(ticks["warm"][name]["cpu_ms"] for name in ticked)
        result["idle_tick_cpu_ms_median"] = median(ticks["warm"][name]["cpu_ms"] for name in ticked)
        result["idle_tick_events_max"] = max(ticks["warm"][name]["events"] for name in ticked)
        cold = [ticks["cold"][name]["cpu_ms"] for name in ticked if "cpu_ms" in ticks["cold"].get(name, {})]
        result["idle_tick_cpu_ms_median_cache_cleared"] = median(cold) if cold else None
    if idle:
        result["idle_cores"] = round(sum(idle.values()), 3)
        result["idle_cores_dagster"] = round(sum(v for k, v in idle.items() if k.startswith("dagster")), 3)
    for key, value in result.items():
        print(f"{key:40} {value}")
    for name in sorted(ticks["warm"]):
        print(f"  tick {name:40} warm {ticks['warm'][name]}  cache cleared {ticks['cold'].get(name)}")
    for kind, value in idle.items():
        print(f"  idle {kind:30} {value} cores")
    record_result(
        "control_plane",
        invocation(),
        f"{args.runs} runs per mode, one at a time, of the platform's code location with a step that does nothing; "
        f"{args.ticks} idle ticks per sensor and mode over {args.seed_batches} done batches per Kafka stream; "
        f"{args.idle_minutes:g} idle minutes; medians; SQLite instance",
        result,
        target={
            "pool_run_cpu_s": "<= 0.5",
            "pool_run_wall_s": "<= 2.0",
            "idle_tick_cpu_ms_max": "<= 50",
            "idle_tick_events_max": "== 0",
            "idle_cores": "<= 0.1",
        },
        baseline={
            "what": "a new interpreter per run (the code server's way)",
            "run_cpu_s": result["baseline_run_cpu_s"],
        },
        load_before=load_before,
    )


if __name__ == "__main__":
    main()
