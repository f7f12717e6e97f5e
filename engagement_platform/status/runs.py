"""The Dagster run storage's side of status: a batch's attempts, and whether its stream is paused, counted the
way the sensors count them (orchestration/runs.py: only runs whose own code failed count towards
MAX_ATTEMPTS; give-ups, orphans, kills and unreachable services do not).

The run storage is the instance DAGSTER_HOME names (scripts/run_platform.sh sets it to
$EP_STATE_DIR/dagster_home, which is also asked when DAGSTER_HOME is unset). Without it, or when its
storage does not answer, the attempts and paused columns are "unavailable".
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import takewhile
from pathlib import Path

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from engagement_platform.orchestration.runs import (
    COORDINATION_TAG,
    FAILED,
    MAX_ATTEMPTS,
    STREAM_TAG,
    UNFINISHED,
    backoff_wait,
    counts_as_attempt,
    died,
)
from engagement_platform.settings import Settings
from engagement_platform.status.report import UNAVAILABLE, Attempts, Batch, Service
from engagement_platform.status.streams import BY_BATCH, StreamRef

RECENT_RUNS = 100  # a tenant's latest runs searched back to its last success
PARTITION_TAG = "dagster/partition"


class RunStorage:
    def __init__(self, instance: DagsterInstance | None, service: Service):
        self.instance, self.service = instance, service

    def attempts(self, ref: StreamRef, batch: Batch | str, span: str | None = None) -> Attempts | str | None:
        """The latest batch's runs (a tenant's runs since its last success); None for a stream Dagster does not
        partition. `span`: the staging versions a processor tenant has to merge (its pause is counted on them)."""
        if ref.partitioned_by is None:
            return None
        if self.instance is None:
            return UNAVAILABLE
        try:
            if ref.partitioned_by != BY_BATCH:
                return self._tenant_attempts(self.instance, ref, span)
            # Without the checkpoint store, which batch is the latest (its partition) is not known.
            return self._batch_attempts(self.instance, ref, batch) if isinstance(batch, Batch) else UNAVAILABLE
        except Exception as e:  # noqa: BLE001 - any error of the run storage (a database away) makes it unavailable
            self.service = Service("dagster", False, f"{type(e).__name__}: {str(e)[:200]}")
            self.instance = None
            return UNAVAILABLE

    def _batch_attempts(self, instance: DagsterInstance, ref: StreamRef, batch: Batch) -> Attempts:
        limit = MAX_ATTEMPTS if ref.pauses else None
        if batch.batch_id is None:
            return Attempts(0, limit)
        runs = instance.get_runs(
            filters=RunsFilter(tags={PARTITION_TAG: f"{batch.batch_id:08d}", STREAM_TAG: ref.name})
        )
        return summary(
            instance, runs, runs, limit, f"{ref.name} batch {batch.batch_id}", unfinished=batch.state != "done"
        )

    def _tenant_attempts(self, instance: DagsterInstance, ref: StreamRef, span: str | None) -> Attempts:
        tenant = {PARTITION_TAG: ref.tenant or ""}
        recent = instance.get_runs(filters=RunsFilter(job_name=ref.job, tags=tenant), limit=RECENT_RUNS)
        since_success = list(takewhile(lambda r: r.status != DagsterRunStatus.SUCCESS, recent))
        counted: Sequence[DagsterRun] = since_success
        if ref.pauses and span is not None:
            from engagement_platform.profiles.processor.sensors import STAGING_RANGE_TAG

            # The processor sensor pauses a tenant whose runs failed MAX_ATTEMPTS times on the same staging versions.
            counted = instance.get_runs(
                filters=RunsFilter(job_name=ref.job, statuses=list(FAILED), tags={**tenant, STAGING_RANGE_TAG: span})
            )
        limit = MAX_ATTEMPTS if ref.pauses else None
        return summary(instance, since_success, counted, limit, ref.tenant or ref.name, unfinished=span is not None)


def summary(
    instance: DagsterInstance,
    runs: Sequence[DagsterRun],
    counted: Sequence[DagsterRun],
    limit: int | None,
    what: str,
    unfinished: bool,
) -> Attempts:
    """Attempts of one batch from its runs (newest first) and the runs its pause counts; `unfinished`: the work
    is not done, so a pause or a backoff can hold it."""
    in_flight = next((r.run_id for r in runs if r.status in UNFINISHED), None)
    ended = [r for r in runs if r.status in FAILED]
    failed = [r for r in counted if r.status in FAILED and counts_as_attempt(r)]
    last = failed[0] if failed else (ended[0] if ended else None)
    paused = limit is not None and unfinished and in_flight is None and len(failed) >= limit
    backoff = backoff_wait(instance, ended, what) if unfinished and in_flight is None and not paused else None
    return Attempts(
        failed=len(failed),
        max_attempts=limit,
        died=sum(died(r) for r in ended),
        gave_up=sum(r.tags.get(COORDINATION_TAG) == "gave_up" for r in ended),
        in_flight=in_flight,
        last_failed_run=last.run_id if last else None,
        last_failed_job=last.job_name if last else None,
        paused=paused,
        backoff=backoff,
    )


def dagster_home(settings: Settings) -> str | None:
    """DAGSTER_HOME, else the folder scripts/run_platform.sh uses when it exists; None when neither."""
    home = os.environ.get("DAGSTER_HOME")
    if home:
        return home
    local = Path(settings.state_dir) / "dagster_home"
    return str(local) if local.is_dir() else None


@contextmanager
def run_storage(settings: Settings, instance: DagsterInstance | None = None) -> Iterator[RunStorage]:
    """The run storage of `instance`, else of the deployment's instance (see the module docstring)."""
    if instance is not None:
        yield RunStorage(instance, Service("dagster", True, "the given instance"))
        return
    home = dagster_home(settings)
    if home is None:
        where = Path(settings.state_dir) / "dagster_home"
        yield RunStorage(None, Service("dagster", False, f"DAGSTER_HOME is not set and {where} does not exist"))
        return
    try:
        opened = DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else DagsterInstance.local_temp(home)
    except Exception as e:  # noqa: BLE001 - a missing folder, a bad dagster.yaml, a database away: all unavailable
        yield RunStorage(None, Service("dagster", False, f"{home}: {type(e).__name__}: {str(e)[:200]}"))
        return
    with opened:
        yield RunStorage(opened, Service("dagster", True, home))
