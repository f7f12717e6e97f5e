"""Does the demo fit the machine? Runs `scripts/run_platform.sh` (stack, demo traffic, Dagster with every
sensor) for a while and prints exactly the figures a user evaluating the platform on a laptop would look at:

    .venv/bin/python -u benchmarks/demo_health.py [--minutes 30] [--warmup-minutes 5] [--sample-seconds 10]

- load average (1-minute) sampled after the warm-up: mean and max, plus the 5- and 15-minute values at the end
  (bound: under 2.0 on 2 cores);
- total RSS of the platform's processes (every process started with this run's EP_STATE_DIR: servers, Dagster,
  its runs, the producers, Spark's Python workers) at the end of the warm-up, its min and max afterwards
  (bound: flat within 10%);
- each Kafka stream's lag (messages on its topic it has not committed), sampled: max and last;
- Dagster runs by job and status, sensor ticks by status: any failed run or failed tick is a failure;
- CPU by process class, and what the load average counts (runnable and blocked tasks, sampled every 0.5 s; iowait):
  a load above the cores busy comes from tasks queueing in bursts or waiting on the disk.

The platform runs in its own state folder (`.state/demo-health`, wiped at start) on the default ports, so no
other stack may be running. Exit status 1 if any bound is not met. The headline figures go to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stack import REPO, machine, processes_of  # noqa: E402
from record import invocation, record_result  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
STREAM_TOPICS = {  # stream -> the settings attribute path of its topic
    "ingestion": ("ingestion", "topic"),
    "mutation": ("mutation", "topic"),
    "retention": ("retention", "topic"),
    "profile_cdc": ("profiles", "cdc_topic"),
    "profile_erasure": ("profiles", "erasure_topic"),
}


def load_average() -> tuple[float, float, float]:
    one, five, fifteen = Path("/proc/loadavg").read_text().split()[:3]
    return float(one), float(five), float(fifteen)


def platform_rss(state_dir: str) -> dict[int, float]:
    """pid -> RSS in MB of every process started with this run's state folder."""
    out = {}
    for pid, proc in processes_of(state_dir).items():
        try:
            out[pid] = int((proc / "statm").read_text().split()[1]) * PAGE / 2**20
        except OSError:  # gone meanwhile
            continue
    return out


CLK = os.sysconf("SC_CLK_TCK")
# Process classes by command line, first match wins: where the machine's CPU goes.
CLASSES = (
    ("ep-run-worker", "dagster runs"),  # a run forked from the run pool: named so, its command line is the pool's
    ("ep-run-pool", "dagster run pool"),
    ("noida-db", "broker (local noida-db)"),
    ("zookeeper", "zookeeper"),
    ("pyspark.daemon", "spark python workers"),
    ("java", "spark connect jvm"),
    ("spawn_main", "dagster runs"),
    ("execute_run", "dagster runs"),
    ("api grpc", "dagster code server"),
    ("code-server start", "dagster code server"),  # the persistent code server's proxy (its server: api grpc)
    ("dagster-daemon", "dagster daemon"),
    ("_daemon", "dagster daemon"),
    ("webserver", "dagster webserver"),
    ("demo-", "demo producers"),
)


def process_cpu(pids) -> dict[int, tuple[str, float]]:
    """pid -> (class, CPU seconds so far) of the given processes."""
    out = {}
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/comm").read_text().strip() + " "
            command += Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = next((name for marker, name in CLASSES if marker in command), "other")
        out[pid] = (kind, (int(fields[11]) + int(fields[12])) / CLK)
    return out


def cpu_by_class(samples: list[dict]) -> dict[str, float]:
    """CPU seconds each class of process used over the samples (a process's CPU before the first of them is not counted)."""
    base: dict[int, float] = {}
    last: dict[int, tuple[str, float]] = {}
    for sample in samples:
        for pid, (kind, seconds) in sample["cpu"].items():
            base.setdefault(pid, seconds if sample is samples[0] else 0.0)
            last[pid] = (kind, seconds)
    totals: dict[str, float] = {}
    for pid, (kind, seconds) in last.items():
        totals[kind] = totals.get(kind, 0.0) + seconds - base[pid]
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores; /proc/stat), to count the short-lived processes
    (run workers live a few seconds) that samples every 10 s mostly miss."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK  # all but idle and iowait


class TaskStates(threading.Thread):
    """What the load average counts, sampled every half second (the load's own sampling is every 5 s): tasks
    (threads) running or runnable, less the sampler itself, and tasks blocked in uninterruptible sleep (mostly
    disk I/O, e.g. a server's fsync). A load above the cores busy is runnable tasks queueing in bursts, or blocked
    ones. `totals()`: cumulative (samples, running, blocked, iowait seconds), differenced over a window."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples = self.running = self.blocked = 0

    def run(self) -> None:
        while True:
            stat = Path("/proc/stat").read_text()
            fields = dict(line.split(maxsplit=1) for line in stat.split("\n") if line.startswith("procs_"))
            self.running += int(fields["procs_running"]) - 1
            self.blocked += int(fields["procs_blocked"])
            self.samples += 1
            time.sleep(0.5)

    def totals(self) -> dict[str, float]:
        iowait = int(Path("/proc/stat").read_text().split(maxsplit=6)[5]) / CLK
        return {"state_samples": self.samples, "running": self.running, "blocked": self.blocked, "iowait_s": iowait}


def rss_by_class(first: dict, last: dict, pids: set[int]) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    for pid in pids:
        kind = last["cpu"].get(pid, first["cpu"].get(pid, ("other", 0.0)))[0]
        a, b = out.get(kind, (0.0, 0.0))
        out[kind] = (a + first["pids"][pid], b + last["pids"][pid])
    return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))


def stream_lags(env: dict[str, str]) -> dict[str, int]:
    """Each Kafka stream's uncommitted messages, asked of the broker and the lake's checkpoint store."""
    from engagement_platform.lake.checkpoints import CheckpointStore
    from engagement_platform.lake.delta import DeltaLake
    from engagement_platform.settings import load_settings
    from engagement_platform.streams.kafka import KafkaClient
    from engagement_platform.streams.planning import uncommitted_records

    settings = load_settings(env)
    client = KafkaClient(settings.kafka_bootstrap_servers, settings.kafka_config)
    store = CheckpointStore(DeltaLake(settings.lake_root, settings.storage_options))
    latest = store.latest_of(list(STREAM_TOPICS))
    lags = {}
    for stream, (section, attribute) in STREAM_TOPICS.items():
        topic = getattr(getattr(settings, section), attribute)
        try:
            lags[stream] = uncommitted_records(*latest[stream], client.watermarks(topic, timeout=5))
        except Exception:  # a topic not created yet, a broker busy for a moment: no sample this time
            continue
    return lags


def dagster_outcome(dagster_home: Path, stopped_at: float) -> dict:
    """Runs by (job, status) and sensor ticks by (sensor, status), read from the stopped instance; a run that
    ended, or a tick that started, after `stopped_at` was interrupted by stopping the demo and is counted apart."""
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    from dagster import DagsterInstance

    with DagsterInstance.get() as instance:
        runs = instance.get_runs()
        by_run = Counter(f"{r.job_name}: {r.status.value}" for r in runs)
        ended = {r.dagster_run.run_id: r.end_time for r in instance.get_run_records()}
        failed = [r for r in runs if r.status.value in ("FAILURE", "CANCELED")]
        failed_runs = [
            f"{r.job_name} {r.run_id} {r.tags.get('dagster/partition', '')}"
            for r in failed
            if (ended.get(r.run_id) or 0) < stopped_at
        ]
        interrupted = [f"{r.job_name} {r.run_id}" for r in failed if (ended.get(r.run_id) or 0) >= stopped_at]
        ticks: Counter = Counter()
        failed_ticks = []
        for state in instance.all_instigator_state():
            for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=100_000):
                ticks[f"{state.instigator_name}: {tick.status.value}"] += 1
                if tick.status.value == "FAILURE":
                    text = f"{state.instigator_name}: {(tick.error.message if tick.error else '')[:300]}"
                    # a tick that started once the stop began saw the code server go away: not the demo's failure
                    (failed_ticks if tick.timestamp < stopped_at else interrupted).append(f"tick {text}")
        breakdown = run_breakdown(instance, [r for r in runs if r.status.value == "SUCCESS"])
    return {
        "runs": dict(sorted(by_run.items())),
        "failed_runs": failed_runs,
        "ticks": dict(sorted(ticks.items())),
        "failed_ticks": failed_ticks,
        "breakdown": breakdown,
        "interrupted_by_stop": interrupted,
    }


def run_breakdown(instance, runs) -> dict[str, dict[str, float]]:
    """Per job, the median seconds of each part of a sensor-launched run, from its event log: queued (waiting for
    the run coordinator), process start + imports + Dagster set-up (starting -> step start), the step's own
    phases (the stream's `seconds_*` metadata: read, commit, lock wait...), the rest of the step (checks,
    materialization events), and the run's end."""
    parts: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        at: dict[str, float] = {}
        phases: dict[str, float] = {}
        for event in instance.all_logs(run.run_id):
            if not event.is_dagster_event:
                continue
            kind = event.dagster_event.event_type_value
            at.setdefault(kind, event.timestamp)
            if kind == "STEP_SUCCESS":
                at["STEP_SUCCESS_LAST"] = event.timestamp
            if kind == "ASSET_MATERIALIZATION":
                for key, value in event.dagster_event.event_specific_data.materialization.metadata.items():
                    if key.startswith("seconds_") and isinstance(value.value, (int, float)):
                        phases[key[len("seconds_") :]] = phases.get(key[len("seconds_") :], 0.0) + float(value.value)
        if (
            not {"PIPELINE_ENQUEUED", "PIPELINE_STARTING", "STEP_START", "STEP_SUCCESS_LAST", "PIPELINE_SUCCESS"}
            <= at.keys()
        ):
            continue
        step = at["STEP_SUCCESS_LAST"] - at["STEP_START"]
        row = {
            "queued": at["PIPELINE_STARTING"] - at["PIPELINE_ENQUEUED"],
            "process_start_imports_setup": at["STEP_START"] - at["PIPELINE_STARTING"],
            "step": step,
            **{f"step.{k}": v for k, v in phases.items()},
            "step.other (checks, events, pins)": max(step - sum(phases.values()), 0.0),
            "run_end": at["PIPELINE_SUCCESS"] - at["STEP_SUCCESS_LAST"],
        }
        for key, value in row.items():
            parts.setdefault(run.job_name, {}).setdefault(key, []).append(value)
    return {
        job: {"runs": len(rows["step"]), **{k: round(statistics.median(v), 2) for k, v in rows.items()}}
        for job, rows in sorted(parts.items())
    }


def fresh_import_seconds() -> float:
    """A new Python process importing the platform's definitions: what every run pays before Dagster starts it."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import engagement_platform.definitions"], cwd=REPO, check=True, capture_output=True
    )
    return time.perf_counter() - start


def wait_for_ui(port: int, process: subprocess.Popen, timeout: float = 600) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if process.poll() is not None:
            raise SystemExit(f"run_platform.sh exited with {process.returncode} before the UI answered")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2)
            return time.monotonic() - start
        except OSError:
            time.sleep(1)
    raise SystemExit("the Dagster UI did not answer")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup-minutes", type=float, default=5.0)
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--port", type=int, default=int(os.environ.get("EP_DAGSTER_PORT", "3000")))
    parser.add_argument("--state-dir", default=str(REPO / ".state" / "demo-health"))
    parser.add_argument(
        "--screenshots", action="store_true", help="run scripts/screenshots.py against the demo at the end"
    )
    parser.add_argument("--max-load", type=float, default=2.0)
    parser.add_argument("--max-rss-growth", type=float, default=0.10)
    args = parser.parse_args()

    state = args.state_dir
    subprocess.run(["rm", "-rf", state], check=True)
    env = {**os.environ, "EP_STATE_DIR": state, "EP_DAGSTER_PORT": str(args.port)}
    print(f"machine: {machine()}; load average before: {load_average()}")
    import_seconds = fresh_import_seconds()
    log = open(Path("/tmp") / f"demo-health-{os.getpid()}.log", "w")
    platform = subprocess.Popen(
        ["bash", str(REPO / "scripts/run_platform.sh")],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    samples: list[dict] = []
    states = TaskStates()
    states.start()
    try:
        print(f"UI answered after {wait_for_ui(args.port, platform):.0f} s (install, stack, Dagster); log {log.name}")
        lag_env = {
            **env,
            "EP_LAKE_ROOT": env.get("EP_LAKE_ROOT") or f"{state}/lake",
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{os.environ.get('EP_KAFKA_PORT', '19092')}",
        }
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < args.minutes * 60:
            if platform.poll() is not None:
                raise SystemExit(f"run_platform.sh exited with {platform.returncode} during the run")
            rss = platform_rss(state)
            sample = {
                "t": round(elapsed),
                "load1": load_average()[0],
                "rss_mb": round(sum(rss.values())),
                "processes": len(rss),
                "lag": stream_lags(lag_env),
            }
            print(json.dumps(sample), flush=True)
            samples.append(
                {
                    **sample,
                    "pids": rss,
                    "cpu": process_cpu(rss),
                    "machine_busy": machine_busy_seconds(),
                    **states.totals(),
                }
            )
            time.sleep(max(0.0, args.sample_seconds - (time.monotonic() - start - elapsed)))
        at_end = load_average()
        if args.screenshots:  # after the measured window, before the stop: the README's pictures of this very run
            subprocess.run(
                [sys.executable, str(REPO / "scripts" / "screenshots.py"), "--url", f"http://127.0.0.1:{args.port}"],
                cwd=REPO,
                check=False,
            )
        stopped_at = time.time()  # runs the stop interrupts are not failures of the demo
    finally:
        if platform.poll() is None:
            os.killpg(platform.pid, signal.SIGTERM)  # run_platform.sh stops everything it started on TERM
            try:
                platform.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(platform.pid, signal.SIGKILL)
    outcome = {**dagster_outcome(Path(state) / "dagster_home", stopped_at), "import_seconds": import_seconds}
    return report(samples, at_end, outcome, args)


def report(samples: list[dict], at_end: tuple[float, float, float], outcome: dict, args) -> int:
    after = [s for s in samples if s["t"] >= args.warmup_minutes * 60] or samples
    loads = [s["load1"] for s in after]
    # Run processes come and go (a few hundred MB each), so one sample's total swings with how many runs are in
    # flight: the bound compares the median total of the first and last third after warm-up, and, separately,
    # the processes alive for the whole window (servers, Dagster, producers: where a leak would show).
    third = max(len(after) // 3, 1)
    first, last = (
        statistics.median(s["rss_mb"] for s in after[:third]),
        statistics.median(s["rss_mb"] for s in after[-third:]),
    )
    growth = (last - first) / first
    resident = set(after[0]["pids"]) & set(samples[-1]["pids"])
    resident_first = sum(after[0]["pids"][p] for p in resident)
    resident_last = sum(samples[-1]["pids"][p] for p in resident)
    resident_growth = (resident_last - resident_first) / resident_first if resident_first else 0.0
    streams = sorted({k for s in samples for k in s["lag"]})
    lag = {k: {"max": max(s["lag"].get(k, 0) for s in after), "last": samples[-1]["lag"].get(k)} for k in streams}
    checks = {
        f"load average (1 min) after warm-up: mean {statistics.mean(loads):.2f}, max {max(loads):.2f}; at the end "
        f"5 min {at_end[1]:.2f}, 15 min {at_end[2]:.2f} (bound {args.max_load})": at_end[1] < args.max_load
        and statistics.mean(loads) < args.max_load,
        f"platform RSS, median total: {first:.0f} MB in the first third after warm-up, {last:.0f} MB in the last ({growth:+.1%}; "
        f"samples {min(s['rss_mb'] for s in after)}-{max(s['rss_mb'] for s in after)} MB; bound {args.max_rss_growth:.0%})": growth
        <= args.max_rss_growth,
        f"RSS of the {len(resident)} processes alive the whole window: {resident_first:.0f} -> {resident_last:.0f} MB "
        f"({resident_growth:+.1%}; bound {args.max_rss_growth:.0%})": resident_growth <= args.max_rss_growth,
        f"failed runs: {len(outcome['failed_runs'])}": not outcome["failed_runs"],
        f"failed sensor ticks: {len(outcome['failed_ticks'])}": not outcome["failed_ticks"],
    }
    print(
        f"\n{args.minutes:g} minutes of demo, {len(samples)} samples ({len(after)} after {args.warmup_minutes:g} min of warm-up)"
    )
    for line, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {line}")
    window = after[-1]["t"] - after[0]["t"] or 1
    print("  RSS by process class, alive the whole window (MB, after warm-up -> end):")
    for kind, (start_mb, end_mb) in rss_by_class(after[0], samples[-1], resident).items():
        print(f"    {kind}: {start_mb:.0f} -> {end_mb:.0f}")
    print(f"  CPU by process class over the {window} s after warm-up (cores busy on average; 2 cores):")
    classes = cpu_by_class(after)
    busy = after[-1]["machine_busy"] - after[0]["machine_busy"]
    for kind, seconds in classes.items():
        print(f"    {kind}: {seconds:.0f} CPU s = {seconds / window:.2f} cores")
    print(
        f"    not seen by a sample (short-lived: run workers, CLI calls): {busy - sum(classes.values()):.0f} CPU s = "
        f"{(busy - sum(classes.values())) / window:.2f} cores; the machine in all: {busy / window:.2f} cores busy"
    )
    iowait = (after[-1]["iowait_s"] - after[0]["iowait_s"]) / window
    state_samples = max(after[-1]["state_samples"] - after[0]["state_samples"], 1)
    running = (after[-1]["running"] - after[0]["running"]) / state_samples
    blocked = (after[-1]["blocked"] - after[0]["blocked"]) / state_samples
    print(
        f"  what the load counts ({state_samples} samples, every 0.5 s): runnable tasks mean {running:.2f}, blocked "
        f"(uninterruptible, mostly disk I/O) mean {blocked:.2f}; iowait {iowait:.2f} cores"
    )
    print("  stream lag in messages (max after warm-up / last):", json.dumps(lag))
    print("  runs:", json.dumps(outcome["runs"], indent=1))
    print(
        f"  a fresh process importing the definitions: {outcome['import_seconds']:.2f} s (before the run, idle stack)"
    )
    print("  median seconds per part of a successful run, by job:")
    for job, parts in outcome["breakdown"].items():
        print(f"    {job}: " + ", ".join(f"{k} {v}" for k, v in parts.items()))
    print("  ticks:", json.dumps(outcome["ticks"], indent=1))
    for line in outcome["interrupted_by_stop"]:
        print("  interrupted by stopping the demo (not counted):", line)
    for line in outcome["failed_runs"] + outcome["failed_ticks"]:
        print("  failed:", line)
    record_result(
        "demo_health",
        invocation(),
        f"the demo's default traffic for {args.minutes:g} minutes after a {args.warmup_minutes:g}-minute warm-up",
        {
            "load_1min_mean": round(statistics.mean(loads), 2),
            "load_1min_max": round(max(loads), 2),
            "load_5min_end": round(at_end[1], 2),
            "rss_growth": round(growth, 3),
            "resident_rss_growth": round(resident_growth, 3),
            "failed_runs": len(outcome["failed_runs"]),
            "failed_ticks": len(outcome["failed_ticks"]),
            "cores_busy": round(busy / window, 2),
            "runnable_tasks_mean": round(running, 2),
            "blocked_tasks_mean": round(blocked, 2),
            "cores_iowait": round(iowait, 2),
        },
        target={
            "load_1min_mean": f"< {args.max_load}",
            "load_5min_end": f"< {args.max_load}",
            "rss_growth": f"<= {args.max_rss_growth}",
            "resident_rss_growth": f"<= {args.max_rss_growth}",
            "failed_runs": "== 0",
            "failed_ticks": "== 0",
        },
    )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
