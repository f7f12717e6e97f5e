"""A tiny code location for the run pool's tests: a job that records its worker, and one that waits to be cancelled."""

import json
import os
import threading
import time
from pathlib import Path

from dagster import Config, Definitions, OpExecutionContext, in_process_executor, job, op

# Read while the code location loads, as the platform reads its landing pipelines' YAML: a change to it must reach
# the runs as a change to the code does.
GREETING = json.loads(Path(__file__).with_name("pool_location.json").read_text())["greeting"]


class WorkerReport(Config):
    report_path: str
    wait_s: float = 0.0


@op
def report_worker(context: OpExecutionContext, config: WorkerReport) -> None:
    """Writes what the worker process looks like from inside: its pid, parent, and threads when the op starts."""
    Path(config.report_path).write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "name": Path("/proc/self/comm").read_text().strip(),
                "python_threads": threading.active_count(),
                "run_id": context.run_id,
                "greeting": GREETING,
            }
        )
    )
    deadline = time.monotonic() + config.wait_s
    while time.monotonic() < deadline:
        time.sleep(0.1)


@job(executor_def=in_process_executor)  # the step in the worker itself, as the platform's jobs run
def worker_report_job() -> None:
    report_worker()


defs = Definitions(jobs=[worker_report_job])
