"""The platform's run launcher: each run a process of its own, forked from a process that already holds the code.

`ForkingRunLauncher` is Dagster's default launcher with one change: a run of a code location loaded from a
Python module is started by the run pool (run_pool.py), which forks a preloaded server instead of starting a
new interpreter that imports everything again. Everything else is the default launcher's: one process per
run that writes its own events, terminate by signal (SIGINT, which Dagster turns into a cancel), and the
platform's ZooKeeper liveness check for runs whose process died (orphans.py). A code location that is not a
module, a pool that cannot start, or `preload: false` launch the default way, through the code server.

Configured in dagster.yaml:

    run_launcher:
      module: engagement_platform.orchestration.launcher
      class: ForkingRunLauncher
      config:
        preload: true   # false: every run through the code server (the baseline the benchmark compares)
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Mapping
from typing import Any, Self

from dagster import DefaultRunLauncher, Field, serialize_value
from dagster._core.code_pointer import ModuleCodePointer
from dagster._core.launcher import LaunchRunContext
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import ConfigurableClassData

from engagement_platform.orchestration.run_pool import PoolServer, RunPoolError

WORKER_TAG = "engagement/run_worker"  # "<host>:<pid>:<start ticks>" of a worker the pool forked


def process_start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), which tells it from a later one with its pid.

    None when no such process runs: an exited process whose parent has not reaped it yet (state Z or X) still has
    a /proc entry, but it runs no code and cannot be signalled into cancelling a run.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def worker_tag(host: str, pid: int, start_ticks: str | None) -> str:
    return f"{host}:{pid}:{start_ticks or ''}"


def live_worker_pid(tag: str | None, host: str) -> int | None:
    """The pid of the worker a tag names, if it is this host's and still that very process."""
    if not tag or tag.count(":") < 2:
        return None
    tag_host, pid_text, start_ticks = tag.rsplit(":", 2)
    if tag_host != host or not pid_text.isdigit():
        return None
    pid = int(pid_text)
    current = process_start_ticks(pid)
    if current is None or (start_ticks and current != start_ticks):
        return None
    return pid


class ForkingRunLauncher(DefaultRunLauncher):
    """Launches each run as a process forked from a server that has imported the code location."""

    def __init__(self, inst_data: ConfigurableClassData | None = None, preload: bool = True):
        super().__init__(inst_data=inst_data)
        self._preload = preload
        self._servers: dict[tuple[str, str, str | None], PoolServer] = {}
        self._servers_lock = threading.Lock()

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {"preload": Field(bool, is_required=False, default_value=True)}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> Self:
        return cls(inst_data=inst_data, preload=bool(config_value.get("preload", True)))

    def pool_servers(self) -> list[PoolServer]:
        """The pool servers this launcher runs now, one per code location it launched runs of."""
        with self._servers_lock:
            return list(self._servers.values())

    def _server_for(self, executable: str, module: str, working_directory: str | None) -> PoolServer:
        key = (executable, module, working_directory)
        with self._servers_lock:
            server = self._servers.get(key)
            if server is None or not server.is_current():
                if server is not None:
                    server.stop()
                server = PoolServer.start(module, working_directory, executable)
                self._servers[key] = server
            return server

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = run.job_code_origin
        pointer = origin.repository_origin.code_pointer if origin is not None else None
        if not self._preload or origin is None or not isinstance(pointer, ModuleCodePointer):
            super().launch_run(context)
            return
        try:
            server = self._server_for(origin.executable_path, pointer.module, pointer.working_directory)
            execute_args = ExecuteRunArgs(
                job_origin=origin,
                run_id=run.run_id,
                instance_ref=self._instance.get_ref(),
                set_exit_code_on_failure=True,
            )
            pid = server.fork_run(serialize_value(execute_args))
        except (RunPoolError, OSError) as error:
            self._instance.report_engine_event(
                f"The run pool could not start this run ({error}); launching it through the code server instead.",
                run,
                cls=self.__class__,
            )
            super().launch_run(context)
            return
        tag = worker_tag(socket.gethostname(), pid, process_start_ticks(pid))
        self._instance.add_run_tags(run.run_id, {WORKER_TAG: tag})
        self._instance.report_engine_event(
            f"Run worker forked from the run pool (pid {pid}, pool server pid {server.process.pid}).",
            run,
            cls=self.__class__,
        )

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id) if self.has_instance else None
        if run is None or WORKER_TAG not in run.tags:
            return bool(super().terminate(run_id))
        if run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        pid = live_worker_pid(run.tags.get(WORKER_TAG), socket.gethostname())
        if pid is None:
            self._instance.report_engine_event(
                "The run's worker process is not on this host or no longer runs: nothing to signal.",
                run,
                cls=self.__class__,
            )
            return False
        os.kill(pid, signal.SIGINT)  # Dagster's run worker turns it into a clean cancel of the run
        return True

    def dispose(self) -> None:
        with self._servers_lock:
            for server in self._servers.values():
                server.stop()
            self._servers.clear()
