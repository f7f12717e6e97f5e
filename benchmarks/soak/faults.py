"""Fault injection for the soak: kinds and moments drawn from a seeded random.Random, injected one at a time from
a thread, each recorded with when it was injected and when it cleared; and the time each took to recover.

Kinds:
- run_kill:    SIGKILL a Dagster run worker of this soak (the platform's orphan check must retry its batch);
- run_pause:   SIGSTOP a run worker for longer than the coordinator's ZooKeeper session timeout, then SIGCONT
               (its lease is gone: fencing must keep it from committing; its batch is retried);
- daemon_kill: SIGKILL the dagster daemon (sensors, run queue, run monitoring), restart it a few seconds later;
- zookeeper_restart / broker_restart / spark_restart: `scripts/stack.sh stop <server>` (SIGTERM, then SIGKILL
               after 30 s), down a few seconds, `start <server>` with the soak's ports and state folder;
- zookeeper_session_expiry: SIGSTOP the ZooKeeper server past the clients' session timeout, then SIGCONT: when it
               resumes it expires the sessions that went quiet, so every run holding a lock loses its ephemeral
               lock and liveness nodes at once (a restart need not: sessions outlive a quick restart).

Faults may overlap (`max_concurrent`, as real failures do): a fault starts at its planned moment unless as many
are already active or one is active on the same target (a server, the daemon); then it starts once that clears.
Spaced (`spaced`): one at a time instead, each once the platform is back to committing after the one before, so
each recovery is a single fault's; planned moments are ignored.

A process belongs to the soak when its environment names the soak's EP_STATE_DIR (as benchmarks/demo_health.py's
platform_rss finds them). A run worker is a process named `ep-run-worker` (forked from the platform's run pool), a
`dagster api execute_run` process, or, with the code server launching runs, a multiprocessing child (`spawn_main`)
of a code server (`dagster api grpc`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks._stack import REPO, processes_of
from engagement_platform.orchestration.run_pool import WORKER_NAME

CONTROL = "no_fault"  # control moments (control_moments): the same measure where nothing was injected
KINDS = (
    "run_kill",
    "run_pause",
    "daemon_kill",
    "zookeeper_restart",
    "zookeeper_session_expiry",
    "broker_restart",
    "spark_restart",
)
SERVERS = {"zookeeper_restart": "zookeeper", "broker_restart": "kafka", "spark_restart": "spark"}
TARGETS = {
    **SERVERS,
    "zookeeper_session_expiry": "zookeeper",
    "daemon_kill": "daemon",
}  # run faults pick any run: no target
# CoordinatorResource.session_timeout_s (resources.py), the kazoo session of streams/coordinator.py: a run stopped
# longer than this has lost its ephemeral lock and liveness nodes.
ZK_SESSION_TIMEOUT_S = 10.0
LOCATION = "engagement_platform.definitions"  # the code location (module) the soak's code server serves


@dataclass
class Fault:
    kind: str
    planned: float  # seconds after the start of the soak
    hold: float  # seconds the fault lasts: a pause, or a server / daemon down
    injected: float | None = None  # seconds after the start
    cleared: float | None = None
    detail: str = ""


@dataclass
class Sample:
    """What the soak saw at `t` (seconds after the start): per stream, the offsets its last done batch committed
    up to and the topic's high watermarks."""

    t: float
    committed: dict[str, dict[int, int]]
    highs: dict[str, dict[int, int]]


def plan_faults(rng: random.Random, count: int, window_s: float, every_kind_in_turn: bool = False) -> list[Fault]:
    """`count` faults at random moments of the window (after a first minute of warm-up when the window allows), of
    random kinds, or with `every_kind_in_turn` of each kind in turn (a shuffled order, repeated): a short spaced
    run then still meets every kind."""
    start = min(60.0, window_s / 4)
    faults = []
    order = (
        rng.sample(KINDS, len(KINDS)) if every_kind_in_turn else KINDS
    )  # drawn only then: a seed's random plan stays as it was
    for i, t in enumerate(sorted(rng.uniform(start, window_s) for _ in range(count))):
        kind = order[i % len(order)] if every_kind_in_turn else rng.choice(KINDS)
        past_session = kind in ("run_pause", "zookeeper_session_expiry")
        hold = ZK_SESSION_TIMEOUT_S + rng.uniform(5, 15) if past_session else rng.uniform(2, 15)
        faults.append(Fault(kind, round(t, 1), round(hold, 1)))
    return faults


def soak_processes(state_dir: str) -> dict[int, bytes]:
    """pid -> command line of every process whose environment names this soak's state folder."""
    out = {}
    for pid, proc in processes_of(state_dir).items():
        try:
            out[pid] = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:  # gone meanwhile
            continue
    return out


def run_workers(state_dir: str) -> list[int]:
    processes = soak_processes(state_dir)
    workers = []
    for pid, cmd in processes.items():
        try:
            forked_worker = Path(f"/proc/{pid}/comm").read_text().strip() == WORKER_NAME
        except OSError:
            continue
        if forked_worker or (b"dagster" in cmd and b"execute_run" in cmd):
            workers.append(pid)
        elif b"spawn_main" in cmd:
            try:
                parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if b"dagster" in processes.get(parent, b"") and b"grpc" in processes.get(parent, b""):
                workers.append(pid)
    return sorted(workers)


def stack(action: str, servers: list[str], env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "stack.sh"), action, *servers], env=env, check=check, capture_output=True
    )


class Daemon:
    """`dagster-daemon run` with the soak's environment, in a process group of its own (the run pool and its run
    workers start there too), against a persistent code server of its own (`dagster code-server start`, another
    group), as a deployment runs them: a `python_module` workspace would have the daemon start a new code server
    every minute, each importing the definitions again. Every group it ever had is swept at the end."""

    def __init__(self, env: dict[str, str], log: Path):
        self.env, self.log, self.process, self.groups = env, log, None, []
        self.down = False  # killed on purpose (a fault): nobody else restarts it meanwhile
        self.code_server: subprocess.Popen | None = None
        self.workspace = log.parent / "workspace.yaml"

    def start_code_server(self, timeout_s: float = 240.0) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        dagster = str(REPO / ".venv" / "bin" / "dagster")
        self.code_server = self.spawn(
            [dagster, "code-server", "start", "-m", LOCATION, "-h", "127.0.0.1", "-p", str(port)],
            self.log.parent / "code-server.log",
        )
        deadline = time.monotonic() + timeout_s
        health = [dagster, "api", "grpc-health-check", "-p", str(port), "-h", "127.0.0.1"]
        while subprocess.run(health, env=self.env, capture_output=True, check=False).returncode != 0:
            if self.code_server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the soak's code server did not come up; see {self.log.parent / 'code-server.log'}")
            time.sleep(1)
        entry = {"grpc_server": {"host": "127.0.0.1", "port": port, "location_name": LOCATION}}
        self.workspace.write_text(json.dumps({"load_from": [entry]}))  # YAML is a superset of JSON

    def start(self) -> None:
        if self.code_server is None or self.code_server.poll() is not None:
            self.start_code_server()
        self.process = self.spawn(
            [str(REPO / ".venv" / "bin" / "dagster-daemon"), "run", "-w", str(self.workspace)], self.log
        )
        self.down = False

    def spawn(self, command: list[str], log: Path) -> subprocess.Popen:
        """`command` with the soak's environment, appending to `log`, in a process group of its own (swept at stop)."""
        with open(log, "a") as out:
            process = subprocess.Popen(
                command, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.groups.append(process.pid)
        return process

    def exited_by_itself(self) -> bool:
        return self.process is not None and not self.down and self.process.poll() is not None

    def kill(self) -> None:
        """SIGKILL the daemon process only: its code server and runs live on, as after a crash of the daemon."""
        self.down = True
        self.process.kill()
        self.process.wait()

    def stop(self, timeout: float = 60) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # the daemon maps SIGTERM to an interrupt and shuts down cleanly
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.code_server is not None and self.code_server.poll() is None:
            self.code_server.terminate()
            try:
                self.code_server.wait(30)
            except subprocess.TimeoutExpired:
                self.code_server.kill()
        for group in self.groups:  # code servers and run workers left in the groups we created
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(group, sig)
                except ProcessLookupError:
                    break
                time.sleep(2)


class Injector(threading.Thread):
    """Injects the planned faults at their moments, each in a thread of its own: at most `max_concurrent` at once and
    one per target (a fault waits for those to clear, and starts late)."""

    def __init__(
        self,
        faults: list[Fault],
        start: float,
        window_s: float,
        env: dict[str, str],
        daemon: Daemon,
        rng: random.Random,
        max_concurrent: int = 1,
        spaced: list[Sample] | None = None,
        gap_s: tuple[float, float] = (45.0, 90.0),
    ):
        super().__init__(name="soak-faults", daemon=True)
        self.faults, self.start_at, self.window_s = faults, start, window_s
        self.env, self.state_dir, self.daemon, self.rng = env, env["EP_STATE_DIR"], daemon, rng
        self.max_concurrent = max_concurrent
        self.spaced = (
            spaced  # the runner's samples: inject one fault at a time, each after the last one's recovery (run_spaced)
        )
        self.gap_s = gap_s  # spaced: quiet seconds between one fault's recovery and the next fault, drawn in this range
        self.halt = threading.Event()
        self.active: dict[threading.Thread, str | None] = {}  # fault thread -> its target
        self.lock = threading.Lock()  # rng and active are shared by the fault threads

    def now(self) -> float:
        return time.monotonic() - self.start_at

    def run(self) -> None:
        if self.spaced is not None:
            return self.run_spaced(self.spaced)
        pending, ready = (
            list(self.faults),
            [],
        )  # planned order; ready: its moment has come, waiting for a slot or its target
        while (pending or ready) and not self.halt.is_set() and self.now() <= self.window_s:
            while pending and pending[0].planned <= self.now():
                ready.append(pending.pop(0))
            for fault in list(ready):  # a fault waiting for its target does not hold up one on another target
                if self.free(TARGETS.get(fault.kind)):
                    ready.remove(fault)
                    self.launch(fault)
            due = pending[0].planned - self.now() if pending else 0.2
            self.halt.wait(max(0.01, min(due, 0.2)))
        for fault in pending + ready:
            fault.detail = fault.detail or "not injected: the produce window was over"
        for thread in list(self.active):  # a fault in progress clears first (a server it stopped is started again)
            thread.join()

    def run_spaced(self, samples: list[Sample], cap: float = 360.0) -> None:
        """Faults in planned order, one at a time: the first at its planned moment (after the warm-up), each next
        once every stream is back to committing after the one before (at most `cap` seconds after it cleared) and
        a quiet gap (`gap_s`, in which the control is measured too): recovery from one fault alone."""
        if self.faults:
            self.halt.wait(max(0.0, self.faults[0].planned - self.now()))
        for fault in self.faults:
            if self.halt.is_set() or self.now() > self.window_s:
                fault.detail = fault.detail or (
                    "not injected: the soak stopped"
                    if self.halt.is_set()
                    else "not injected: the produce window was over"
                )
                continue
            self.inject_reported(fault)
            while (
                fault.cleared is not None
                and not self.halt.is_set()
                and self.now() - fault.cleared < cap
                and resumed_after(fault, list(samples)) is None
            ):
                self.halt.wait(1.0)
            with self.lock:
                gap = self.rng.uniform(*self.gap_s)
            self.halt.wait(gap)

    def launch(self, fault: Fault) -> None:
        thread = threading.Thread(target=self.inject_reported, args=(fault,), name=f"fault-{fault.kind}", daemon=True)
        with self.lock:
            self.active[thread] = TARGETS.get(fault.kind)
        thread.start()

    def free(self, target: str | None) -> bool:
        with self.lock:
            for thread in [t for t in self.active if not t.is_alive()]:
                del self.active[thread]
            return len(self.active) < self.max_concurrent and (target is None or target not in self.active.values())

    def inject_reported(self, fault: Fault) -> None:
        try:
            self.inject(fault)
        except Exception as exc:  # a fault that could not be injected is reported, the soak goes on
            fault.detail = f"failed: {exc!r}"[:300]
        print(f"fault {fault.kind}: injected {fault.injected}, cleared {fault.cleared} {fault.detail}", flush=True)

    def inject(self, fault: Fault) -> None:
        if fault.kind in ("run_kill", "run_pause"):
            pid = self.some_run_worker()
            if pid is None:
                fault.detail = "not injected: no run in flight within 60 s"
                return
            fault.injected, fault.detail = self.now(), f"pid {pid}"
            os.kill(pid, signal.SIGKILL if fault.kind == "run_kill" else signal.SIGSTOP)
            if fault.kind == "run_pause":
                time.sleep(fault.hold)
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    fault.detail += " (gone before SIGCONT)"
            fault.cleared = self.now()
        elif fault.kind == "zookeeper_session_expiry":
            pid = int((Path(self.state_dir) / "pids" / "zookeeper.pid").read_text().strip())
            fault.injected, fault.detail = self.now(), f"pid {pid}"
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(fault.hold)
            finally:
                os.kill(pid, signal.SIGCONT)
            fault.cleared = self.now()
        elif fault.kind == "daemon_kill":
            fault.injected = self.now()
            self.daemon.kill()
            time.sleep(fault.hold)
            self.daemon.start()
            fault.cleared = self.now()
        else:
            server = SERVERS[fault.kind]
            fault.injected = self.now()
            stopped = stack("stop", [server], self.env, check=False)  # whatever happened, start it again below
            fault.detail = "" if stopped.returncode == 0 else f"stop exited {stopped.returncode}; "
            time.sleep(fault.hold)
            for attempt in range(3):  # a port still in TIME_WAIT, a slow JVM: try again rather than end the soak
                if stack("start", [server], self.env, check=False).returncode == 0:
                    break
                fault.detail += f"start attempt {attempt + 1} failed; "
                time.sleep(5)
            fault.cleared = self.now()

    def some_run_worker(self, within: float = 60) -> int | None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and not self.halt.is_set():
            workers = run_workers(self.state_dir)
            if workers:
                with self.lock:
                    return self.rng.choice(workers)
            time.sleep(0.5)
        return None


def recovery_seconds(faults: list[Fault], samples: list[Sample]) -> dict[str, list[float | None]]:
    """Per kind, for each fault that cleared: seconds from clearing until every stream had committed everything its
    topic held when the fault cleared (None: never, within the samples)."""
    out: dict[str, list[float | None]] = {}
    for fault in faults:
        if fault.cleared is None:
            continue
        after = [s for s in samples if s.t >= fault.cleared]
        target = after[0].highs if after else {}
        took = next(
            (
                s.t - fault.cleared
                for s in after
                if all(
                    s.committed.get(stream, {}).get(p, 0) >= high
                    for stream, highs in target.items()
                    for p, high in highs.items()
                )
            ),
            None,
        )
        out.setdefault(fault.kind, []).append(took)
    return out


def resumed_after(fault: Fault, samples: list[Sample]) -> float | None:
    """Seconds from the fault's clearing until every stream that had records waiting then had committed a batch
    past where it stood (the issue's "back to committing"; None: some stream never did, within the samples). A
    stream with nothing waiting is not waited for."""
    after = [s for s in samples if s.t >= fault.cleared]
    if not after:
        return None
    first = after[0]
    pending = {
        stream
        for stream, highs in first.highs.items()
        if any(high > first.committed.get(stream, {}).get(p, 0) for p, high in highs.items())
    }

    def moved(sample: Sample, stream: str) -> bool:
        before = first.committed.get(stream, {})
        return any(offset > before.get(p, 0) for p, offset in sample.committed.get(stream, {}).items())

    for sample in after:
        pending = {stream for stream in pending if not moved(sample, stream)}
        if not pending:
            return sample.t - fault.cleared
    return None


def resumed_seconds(faults: list[Fault], samples: list[Sample]) -> dict[str, list[float | None]]:
    """Per kind, resumed_after of each fault that cleared."""
    out: dict[str, list[float | None]] = {}
    for fault in faults:
        if fault.cleared is not None:
            out.setdefault(fault.kind, []).append(resumed_after(fault, samples))
    return out


def control_moments(
    faults: list[Fault], samples: list[Sample], window_s: float, every: float = 15.0, start: float = 60.0
) -> list[Fault]:
    """The control: moments of the produce window, every `every` seconds from `start`, outside every fault's span
    (from its injection until it was back to committing) and whose own measure ends before the next fault, as
    zero-length faults of kind CONTROL. Their "back to committing" is the platform's batch cadence on this
    machine with nothing wrong, the floor any fault's recovery is measured against."""
    spans = []
    for f in faults:
        if f.injected is None:
            continue
        took = resumed_after(f, samples) if f.cleared is not None else None
        spans.append((f.injected, float("inf") if took is None else f.cleared + took))
    moments, t = [], start
    while t <= window_s:
        if not any(begin <= t <= end for begin, end in spans):
            moment = Fault(CONTROL, t, 0.0, injected=t, cleared=t)
            took = resumed_after(moment, samples)
            if took is not None and not any(t < begin <= t + took for begin, _ in spans):
                moments.append(moment)
        t += every
    return moments


def _figures(times: list[float | None]) -> str:
    done = [t for t in times if t is not None]
    never = len(times) - len(done)
    figures = f"median {statistics.median(done):.0f} s, max {max(done):.0f} s" if done else "none measured"
    return f"{figures}, never {never}"


def summary(faults: list[Fault], samples: list[Sample], window_s: float) -> list[str]:
    """One line per kind: injected / planned; seconds until every stream was back to committing (resumed_seconds)
    and until every stream had caught up with what its topic held when the fault cleared (recovery_seconds); then
    the same for the control moments (control_moments), when the run had any."""
    control = control_moments(faults, samples, window_s)
    recovered, resumed = recovery_seconds(faults + control, samples), resumed_seconds(faults + control, samples)
    lines = []
    for kind in KINDS:
        of_kind = [f for f in faults if f.kind == kind]
        if not of_kind:
            continue
        lines.append(
            f"{kind}: {sum(f.injected is not None for f in of_kind)} injected of {len(of_kind)} planned; "
            f"back to committing {_figures(resumed.get(kind, []))}; caught up {_figures(recovered.get(kind, []))}"
        )
    if control:
        lines.append(
            f"{CONTROL} (control: {len(control)} moments outside every fault's span): back to committing "
            f"{_figures(resumed[CONTROL])}; caught up {_figures(recovered[CONTROL])}"
        )
    return lines
