"""Benchmarks run on their own copy of the local stack (own ports and state folder)."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PORTS = {
    "EP_ZK_PORT": "42181",
    "EP_KAFKA_PORT": "49092",
    "EP_SPARK_CONNECT_PORT": "45002",
    # the Connect application's UI: its REST API gives the task metrics benchmarks split a run by (spark_metrics.py)
    "EP_SPARK_UI_PORT": "44040",
    # the two-worker standalone cluster a benchmark compares with local[2] (start_cluster)
    "EP_SPARK_MASTER_PORT": "47077",
    "EP_SPARK_MASTER_UI_PORT": "48080",
    "EP_SPARK_WORKER_UI_PORTS": "48081 48082",
}


START_ATTEMPTS = 8


@contextmanager
def bench_stack(name: str, servers: tuple[str, ...] = ("kafka", "spark")):
    """Start the servers fresh (state wiped), export the settings, yield the env; stop at the end."""
    state = REPO / ".state" / f"bench-{name}"
    env = {**os.environ, **PORTS, "EP_STATE_DIR": str(state)}
    subprocess.run(["bash", str(REPO / "scripts/stack.sh"), "stop"], env=env, check=False, capture_output=True)
    subprocess.run(["rm", "-rf", str(state)], check=True)
    t0 = time.perf_counter()
    for attempt in range(START_ATTEMPTS):
        # A busy machine's ephemeral client ports sometimes sit on the bench ports (TIME-WAIT), and a server then
        # fails to bind; the socket clears within a minute.
        start = subprocess.run(
            ["bash", str(REPO / "scripts/stack.sh"), "start", *servers], env=env, check=False, capture_output=True
        )
        if start.returncode == 0:
            break
        subprocess.run(["bash", str(REPO / "scripts/stack.sh"), "stop"], env=env, check=False, capture_output=True)
        if attempt == START_ATTEMPTS - 1:
            start.check_returncode()
        print(f"stack start failed (attempt {attempt + 1}), retrying in 15 s", flush=True)
        time.sleep(15)
    started = time.perf_counter() - t0
    settings = {
        "EP_STATE_DIR": str(state),
        "EP_LAKE_ROOT": str(state / "lake"),
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{PORTS['EP_KAFKA_PORT']}",
        "ZOOKEEPER_HOSTS": f"127.0.0.1:{PORTS['EP_ZK_PORT']}",
        "SPARK_REMOTE": f"sc://127.0.0.1:{PORTS['EP_SPARK_CONNECT_PORT']}",
    }
    os.environ.update(settings)
    try:
        yield {**settings, "stack_start_seconds": started}
    finally:
        subprocess.run(["bash", str(REPO / "scripts/stack.sh"), "stop"], env=env, check=False, capture_output=True)


def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {mem:.0f} GiB, {platform.python_implementation()} {platform.python_version()}, {platform.system()}"


def wait_for_broker_idle(state_dir: str, quiet_seconds: float = 3.0, timeout: float = 300.0) -> float:
    """Wait until the local broker stops using CPU; returns seconds waited.

    noida-db persists its whole log as one JSON file shortly after writes, which takes a core for
    many seconds after a big produce; timing ingestion during that would measure the local broker's
    persistence, which a real Kafka cluster does not put on the consumer's machine.
    """
    pid = int((Path(state_dir) / "pids" / "kafka.pid").read_text().split()[0])
    ticks = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks

    start = time.monotonic()
    quiet_since = time.monotonic()
    last = cpu()
    while time.monotonic() - start < timeout:
        time.sleep(0.5)
        now = cpu()
        if now - last > 0.05:  # more than 10% of a core in the last half second
            quiet_since = time.monotonic()
        last = now
        if time.monotonic() - quiet_since >= quiet_seconds:
            break
    return time.monotonic() - start


def restart_spark(master: str) -> None:
    """Restart the bench stack's Spark Connect server on another master (e.g. local[1]), same ports."""
    env = {**os.environ, **PORTS, "SPARK_MASTER": master}
    env.pop("SPARK_REMOTE", None)
    for action in ("stop", "start"):
        subprocess.run(
            ["bash", str(REPO / "scripts/stack.sh"), action, "spark"], env=env, check=True, capture_output=True
        )


def start_cluster() -> str:
    """Start the bench stack's Spark standalone cluster (a master and two one-core workers, scripts/stack.sh) and
    restart the Connect server on it; returns the master's URL. The stack's stop stops the cluster too."""
    env = {**os.environ, **PORTS}
    env.pop("SPARK_REMOTE", None)
    subprocess.run(
        ["bash", str(REPO / "scripts/stack.sh"), "start", "spark-master", "spark-worker-1", "spark-worker-2"],
        env=env,
        check=True,
        capture_output=True,
    )
    master = f"spark://127.0.0.1:{PORTS['EP_SPARK_MASTER_PORT']}"
    restart_spark(master)
    return master


def machine_busy_seconds() -> float:
    """CPU seconds every process on the machine has used since boot (all cores, idle and iowait left out)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process (the driver: the client that plans and commits)."""
    times = os.times()
    return times.user + times.system


S3_PORT = "49000"


@contextmanager
def s3_lake(bucket: str = "lake"):
    """An S3 endpoint for a lake (moto_server through stack.sh, in memory) beside the bench stack: its storage
    settings go into this process's environment (what load_settings() reads) for the duration; yields
    (the bucket's URI, the storage options)."""
    env = {**os.environ, **PORTS, "EP_S3_PORT": S3_PORT, "EP_LAKE_BUCKET": bucket}
    subprocess.run(["bash", str(REPO / "scripts/stack.sh"), "start", "s3"], env=env, check=True, capture_output=True)
    options = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{S3_PORT}",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_ALLOW_HTTP": "true",
        "AWS_CONDITIONAL_PUT": "etag",
    }
    os.environ.update(options)
    pid = int((Path(os.environ.get("EP_STATE_DIR", REPO / ".state")) / "pids" / "s3.pid").read_text().split()[0])
    options["cpu_seconds"] = lambda: process_cpu_seconds(pid)  # what the endpoint itself spends (popped by callers)
    try:
        yield f"s3://{bucket}", options
    finally:
        for name in list(options):
            os.environ.pop(name, None)
        subprocess.run(
            ["bash", str(REPO / "scripts/stack.sh"), "stop", "s3"], env=env, check=False, capture_output=True
        )


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def upload_lake(local: Path, uri: str, options: dict) -> float:
    """Copy a local lake folder to an object-store URI (seconds taken)."""
    import pyarrow.fs as pafs

    from engagement_platform.lake.file_writes import filesystem

    t = time.perf_counter()
    fs, base = filesystem(uri, options)
    pafs.copy_files(
        str(local), base, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs, use_threads=True
    )
    return time.perf_counter() - t


def processes_of(state_dir: str) -> dict[int, Path]:
    """pid -> /proc/<pid> of every process whose environment names this EP_STATE_DIR (a stack, Dagster and the
    runs it started all inherit it; other processes on the machine do not)."""
    marker = f"EP_STATE_DIR={state_dir}".encode()
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                out[int(entry.name)] = entry
        except OSError:  # gone, or not ours to read
            continue
    return out
