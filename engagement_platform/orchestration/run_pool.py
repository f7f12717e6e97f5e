"""A pool that starts Dagster run workers by forking a process that has already imported the code location.

A run worker started the usual way (a code server spawns `dagster api execute_run`) is a new interpreter that
imports Dagster, PySpark and the definitions before the stream's first line runs: 2.5 CPU-s for a run of a step
that does nothing on a 2-core machine (benchmarks/control_plane.py), most of a small batch's cost. The pool server imports the code location once, then
forks one child per run. The child is a plain run worker, one process per run as before: it executes the run
through Dagster's own `dagster api execute_run` command, so it can be killed, it writes its events and status
itself, and the platform's ZooKeeper liveness node (orphans.py) judges it like any other run.

Fork safety: the server holds no network client, lock, Spark session or gRPC channel when it forks; it only
imports modules, listens on a Unix socket and reaps its children; it refuses to serve if a Python thread is
running. Native libraries that start threads at import (OpenBLAS, jemalloc in pyarrow and deltalake) register
fork handlers for this case.

Freshness: the server reports every source file of the code location it imported, and every file and folder
outside the Python installation that loading the code location read (a landing pipeline's YAML, the folder of
them), each with its modification time; the client starts a new server when one of them changed (a developer
edited the code, a pipeline was added), so a run never executes older code than the code server shows. The old server exits once its own children are reaped; runs in flight
carry on.

Protocol (one JSON line each way per connection): `{"hello": true}` -> `{"files": {...}, "pid": N}`;
`{"execute_run_args": "<serialized ExecuteRunArgs>"}` -> `{"pid": N}` or `{"error": "..."}`.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVER_NAME = "ep-run-pool"  # the processes' names (/proc/<pid>/comm, `ps -o comm`, top): who is who at a glance
WORKER_NAME = "ep-run-worker"
READY_TIMEOUT_S = 120.0  # importing the definitions on a loaded 2-core machine can take tens of seconds
REQUEST_TIMEOUT_S = 30.0


# ----------------------------------------------------------------------------------------------- the server side


def name_this_process(name: str) -> None:
    """Set the process's name as tools show it (Linux prctl PR_SET_NAME); a forked worker's command line stays
    the server's, so its name is what tells a run worker apart (the soak's run faults pick workers by it)."""
    if sys.platform != "linux":
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)  # 15: PR_SET_NAME


class FilesRead:
    """The files and folders opened or listed while it records (a Python audit hook: hooks cannot be removed, so
    this one stops recording instead), outside the Python installation and the system's own folders."""

    IGNORED = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix, "/proc", "/sys", "/dev", "/etc", "/usr"})

    def __init__(self) -> None:
        self.paths: set[str] = set()
        self.recording = True
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.recording or event not in ("open", "os.listdir", "os.scandir"):
            return
        path = args[0] if args else None
        if not isinstance(path, (str, Path)) or str(path).startswith(self.IGNORED) or "__pycache__" in str(path):
            return
        mode, flags = (args[1], args[2]) if event == "open" and len(args) >= 3 else (None, 0)
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        ):
            return  # written, not read: the code location's own output is not its input
        self.paths.add(os.path.abspath(path))

    def stop(self) -> dict[str, int]:
        """Stop recording; each path read, with its modification time (ns) now."""
        self.recording = False
        stamps: dict[str, int] = {}
        for path in self.paths:
            with contextlib.suppress(OSError):
                stamps[path] = os.stat(path).st_mtime_ns
        return stamps


def loaded_sources(root: Path) -> dict[str, int]:
    """Each imported module's source file under `root`, with its modification time (ns)."""
    sources: dict[str, int] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or not path.endswith(".py"):
            continue
        resolved = Path(path).resolve()
        if resolved.is_relative_to(root):
            with contextlib.suppress(OSError):
                sources[str(resolved)] = resolved.stat().st_mtime_ns
    return sources


def _run_worker(execute_run_args: str) -> int:
    """In the forked child: the run, as `dagster api execute_run` would run it; returns the exit code."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Dagster turns SIGINT into a clean cancel
    os.environ["DAGSTER_EXECUTE_RUN_ARGS"] = execute_run_args  # read by the command; never on a command line
    sys.argv = ["dagster", "api", "execute_run"]
    try:
        runpy.run_module("dagster", run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:  # noqa: BLE001 - anything escaping the command is a failed worker
        import traceback

        traceback.print_exc()
        return 1
    return 0


def warm_up_job() -> Any:
    """A job of one step that does nothing: what the server runs once, in itself, before it forks anything."""
    from dagster import in_process_executor, job, op

    @op
    def nothing() -> None:
        pass

    @job(executor_def=in_process_executor)
    def run_pool_warm_up() -> None:
        nothing()

    return run_pool_warm_up


def _warm_up() -> None:
    """Run one throwaway run through the same command a worker runs, on a throwaway instance, in this process.

    A worker forked from a server that only imported the code location still imports about 800 modules (the
    run storage, the execution engine, the command's own) and fills their caches on its first run: most of its
    cost. Done here once, every worker starts with them loaded."""
    from dagster import DagsterInstance, reconstructable, serialize_value
    from dagster._grpc.types import ExecuteRunArgs

    job = reconstructable(warm_up_job)
    with tempfile.TemporaryDirectory(prefix="ep-run-pool-warm-up-") as home:
        Path(home, "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        with DagsterInstance.from_config(home) as instance:
            origin = job.get_python_origin()
            run = instance.create_run_for_job(job_def=warm_up_job(), job_code_origin=origin)
            args = ExecuteRunArgs(job_origin=origin, run_id=run.run_id, instance_ref=instance.get_ref())
            handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
            argv = sys.argv
            try:
                code = _run_worker(serialize_value(args))
            finally:
                sys.argv = argv
                os.environ.pop("DAGSTER_EXECUTE_RUN_ARGS", None)
                for signum, handler in handlers.items():
                    signal.signal(signum, handler)
            if code != 0:
                print(f"run pool: the warm-up run exited with {code}; workers will warm up themselves", file=sys.stderr)


def _fork_run(execute_run_args: str, listener: socket.socket, conn: socket.socket, server_fds: tuple[int, ...]) -> int:
    pid = os.fork()
    if pid != 0:
        return pid
    code = 1
    try:
        listener.close()
        conn.close()
        signal.set_wakeup_fd(-1)
        for fd in server_fds:
            os.close(fd)
        name_this_process(WORKER_NAME)
        gc.unfreeze()
        code = _run_worker(execute_run_args)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _reap_children() -> int:
    reaped = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped += 1


def _has_children() -> bool:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return False
    return pid == 0 or _has_children()


def _answer(
    conn: socket.socket, listener: socket.socket, sources: Mapping[str, int], server_fds: tuple[int, ...]
) -> None:
    conn.settimeout(REQUEST_TIMEOUT_S)
    with conn, conn.makefile("rwb") as stream:
        request = json.loads(stream.readline() or b"{}")
        if request.get("hello"):
            reply: dict[str, Any] = {"pid": os.getpid(), "files": dict(sources)}
        elif isinstance(request.get("execute_run_args"), str):
            reply = {"pid": _fork_run(request["execute_run_args"], listener, conn, server_fds)}
        else:
            reply = {"error": f"unknown request {sorted(request)}"}
        stream.write(json.dumps(reply).encode() + b"\n")
        stream.flush()


def serve(socket_path: str, module_name: str, working_directory: str | None) -> None:
    """Import the code location, then fork a run worker per request until stdin closes (the client is gone)."""
    name_this_process(SERVER_NAME)
    if working_directory:
        os.chdir(working_directory)
        sys.path.insert(0, working_directory)
    files_read = FilesRead()
    importlib.import_module(module_name)
    read_while_loading = files_read.stop()
    # The command line the children run (`python -m dagster`'s own module): imported once here, not per run.
    importlib.import_module("dagster._cli")
    root = Path(working_directory or Path(sys.modules[module_name.split(".")[0]].__file__ or ".").parent).resolve()
    sources = {**read_while_loading, **loaded_sources(root)}
    _warm_up()
    if threading.active_count() != 1:
        raise RuntimeError(f"run pool: {threading.active_count()} Python threads after import; forking is unsafe")
    gc.collect()
    gc.freeze()  # the preloaded objects stay shared with the children instead of being copied by the collector

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(16)
    # A child's exit wakes the loop at once (its byte on this pipe), so a worker is reaped when it ends.
    child_exits, wake = os.pipe()
    os.set_blocking(wake, False)
    os.set_blocking(child_exits, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    lifeline_open = True
    while lifeline_open or _has_children():
        watched: list[Any] = [child_exits, listener, sys.stdin] if lifeline_open else [child_exits]
        readable, _, _ = select.select(watched, [], [], 5.0)
        if child_exits in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(child_exits, 4096)
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 4096):
            lifeline_open = False  # the client closed its end: no new runs; wait for this server's runs to end
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(socket_path)
        if listener in readable and lifeline_open:
            conn, _ = listener.accept()
            try:
                _answer(conn, listener, sources, (child_exits, wake))
            except (OSError, ValueError) as error:
                print(f"run pool: a request failed: {error}", file=sys.stderr, flush=True)
        _reap_children()


# ----------------------------------------------------------------------------------------------- the client side


class RunPoolError(RuntimeError):
    """The pool could not start a run worker (its server did not come up or refused the request)."""


def _exchange(socket_path: str, request: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        conn.connect(socket_path)
        with conn.makefile("rwb") as stream:
            stream.write(json.dumps(request).encode() + b"\n")
            stream.flush()
            line = stream.readline()
    if not line:
        raise RunPoolError(f"run pool at {socket_path} closed the connection without an answer")
    reply: dict[str, Any] = json.loads(line)
    if "error" in reply:
        raise RunPoolError(f"run pool refused the request: {reply['error']}")
    return reply


@dataclass
class PoolServer:
    """One server process, preloaded with one code location (module, working directory, interpreter)."""

    process: subprocess.Popen[bytes]
    socket_path: str
    sources: dict[str, int] = field(default_factory=dict)

    @classmethod
    def start(cls, module_name: str, working_directory: str | None, executable: str) -> PoolServer:
        folder = tempfile.mkdtemp(prefix="ep-run-pool-")  # private (0700): only this user may ask for a run
        socket_path = os.path.join(folder, "pool.sock")
        args = [executable, "-m", __name__, socket_path, module_name, working_directory or ""]
        process = subprocess.Popen(args, stdin=subprocess.PIPE, cwd=working_directory or None)
        server = cls(process, socket_path)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RunPoolError(f"run pool server for {module_name} exited with {process.returncode}")
            if os.path.exists(socket_path):
                with contextlib.suppress(OSError):
                    server.sources = _exchange(socket_path, {"hello": True}, REQUEST_TIMEOUT_S)["files"]
                    return server
            if time.monotonic() > deadline:
                server.stop()
                raise RunPoolError(f"run pool server for {module_name} not ready in {READY_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def is_current(self) -> bool:
        """Alive, and no source file it imported has changed since."""
        if self.process.poll() is not None:
            return False
        for path, mtime_ns in self.sources.items():
            try:
                if os.stat(path).st_mtime_ns != mtime_ns:
                    return False
            except OSError:
                return False
        return True

    def fork_run(self, execute_run_args: str) -> int:
        reply = _exchange(self.socket_path, {"execute_run_args": execute_run_args}, REQUEST_TIMEOUT_S)
        return int(reply["pid"])

    def stop(self) -> None:
        """Close the lifeline: the server takes no new runs and exits once its runs have ended."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        if self.process.poll() is None:
            # Reaped in the background so a retired server never lingers as a zombie of the launcher's process.
            threading.Thread(target=self.process.wait, name="run-pool-reaper", daemon=True).start()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], sys.argv[3] or None)
