"""Runs orphaned by a crash of the Dagster host: found by the stream's sensor, failed, and retried.

When every process of the Dagster host dies at once (a host crash, a container restart, an OOM kill of the
process group), the run that was in flight stays STARTED in the run storage: its process is gone, and the
default run launcher cannot check a worker of a code server that no longer exists, so Dagster's run
monitoring never ends it, and the stream's sensor would wait for it forever.

The platform checks liveness itself: every stream run holds an ephemeral ZooKeeper node while its process
lives (CoordinatorResource). A sensor that finds a run of its stream STARTING or STARTED asks ZooKeeper;
a run without a node and without a sign of life (its start, its last event) for the coordinator's
`orphan_bound_s`, and found without its node by sensor ticks for that long too (MISSING_SINCE_TAG), is marked
failed through the instance, with a message saying why, and tagged ORPHANED_TAG. The second condition spares a
live run that lost its node for a while: a ZooKeeper session expiry deletes it, and a run that was waiting on
ZooKeeper or Spark meanwhile (silent) creates it again only once its client has reconnected, seconds after the
sensor's own client could already see it gone (without this condition, 17 of 21 runs judged orphans under
repeated ZooKeeper restarts were alive). The sensor then requests the batch again as after any failed attempt. Orphaned attempts do
not count towards MAX_ATTEMPTS: the batch is not at fault. QUEUED and NOT_STARTED runs belong to the queue
and are never judged; with ZooKeeper unreachable nothing is judged either.

The retry carries STRANDED_SINCE_TAG (when the first orphaned attempt started), and its materialization
reports STRANDED_METADATA: how long the batch was stranded, up to the retry's start.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from dagster import AssetExecutionContext, DagsterInstance, DagsterRun, DagsterRunStatus

from engagement_platform.resources import CoordinatorResource, LakeResource, run_labels
from engagement_platform.streams.coordinator import CoordinationGaveUp

ORPHANED_TAG = "engagement/orphaned"  # "true" on a run failed because its process was gone
# epoch seconds when a sensor first found the run in flight without its liveness node; "" once a tick saw it again
MISSING_SINCE_TAG = "engagement/liveness_missing_since"
STRANDED_SINCE_TAG = "engagement/stranded_since"  # epoch seconds: start of the batch's first orphaned attempt
STRANDED_METADATA = "seconds_stranded"  # on the materialization of a retry of an orphaned run
JUDGED = frozenset({DagsterRunStatus.STARTING, DagsterRunStatus.STARTED})  # earlier states belong to the run queue


def is_orphaned(run: DagsterRun) -> bool:
    return run.tags.get(ORPHANED_TAG) == "true"


def retry_tags(last: DagsterRun | None) -> dict[str, str]:
    """Tags a retry of the batch carries when its last attempt was orphaned (how long it is stranded)."""
    if last is None or not is_orphaned(last) or STRANDED_SINCE_TAG not in last.tags:
        return {}
    return {STRANDED_SINCE_TAG: last.tags[STRANDED_SINCE_TAG]}


def reap_orphans(
    instance: DagsterInstance, runs: Sequence[DagsterRun], coordinator: CoordinatorResource | None
) -> tuple[list[DagsterRun], str]:
    """Marks failed those of `runs` (unfinished runs of a stream) whose process is gone; returns the
    runs still in flight, and a note for the skip reason when liveness could not be checked ("" if it was)."""
    if coordinator is None or not any(r.status in JUDGED for r in runs):
        return list(runs), ""
    try:
        live = coordinator.live_runs()
    except CoordinationGaveUp as e:
        return list(runs), f"run liveness not checked: {e}"
    if live is None:  # the coordinator is off: no run holds a liveness node
        return list(runs), ""
    bound, now = coordinator.orphan_bound_s, time.time()
    still = []
    for run in runs:
        record = instance.get_run_record_by_id(run.run_id) if run.status in JUDGED else None
        if record is None or record.dagster_run.status not in JUDGED:
            still.append(run)
            continue
        missing_since = record.dagster_run.tags.get(MISSING_SINCE_TAG, "")
        if run.run_id in live:
            if missing_since:  # it lost its node for a while and holds it again
                instance.add_run_tags(run.run_id, {MISSING_SINCE_TAG: ""})
            still.append(run)
            continue
        if not missing_since:
            missing_since = f"{now:.3f}"
            instance.add_run_tags(run.run_id, {MISSING_SINCE_TAG: missing_since})
        missing_s = now - float(missing_since)
        started = record.start_time or _launched_at(instance, run.run_id) or record.create_timestamp.timestamp()
        last_event = _last_event_at(instance, run.run_id) or started
        if now - max(started, last_event) < bound or missing_s < bound:
            still.append(run)
            continue
        since = min(started, float(run.tags.get(STRANDED_SINCE_TAG, started)))
        mark_orphaned(
            instance,
            record.dagster_run,
            (
                f"Process gone: no liveness node in ZooKeeper for run {run.run_id} for {missing_s:.0f}s, started "
                f"{now - started:.0f}s ago, last event {now - last_event:.0f}s ago (bound {bound:g}s): a crash of the Dagster host "
                f"or a kill of the run's process group. "
                f"Marked failed by the stream's sensor, which requests the batch again; this attempt does not count towards the pause."
            ),
            since,
        )
    return still, ""


def mark_orphaned(instance: DagsterInstance, run: DagsterRun, message: str, stranded_since: float) -> None:
    # Tags first: a reader that sees the failure sees why (and does not count it as an attempt).
    instance.add_run_tags(run.run_id, {ORPHANED_TAG: "true", STRANDED_SINCE_TAG: f"{stranded_since:.3f}"})
    instance.report_run_failed(run, message)
    storage = instance.event_log_storage
    if storage.supports_global_concurrency_limits:  # the pool slot its step claimed: nobody else frees it at once
        storage.free_concurrency_slots_for_run(run.run_id)


def stranded_metadata(context: AssetExecutionContext) -> dict[str, float]:
    """STRANDED_METADATA for a retry of an orphaned run (from its tag to this run's start); {} otherwise."""
    since = context.run.tags.get(STRANDED_SINCE_TAG)
    if since is None:
        return {}
    record = context.instance.get_run_record_by_id(context.run_id)
    started = (record.start_time if record is not None else None) or time.time()
    return {STRANDED_METADATA: round(max(started - float(since), 0.0), 1)}


@contextmanager
def run_liveness(context: AssetExecutionContext, lake: LakeResource) -> Iterator[None]:
    """The liveness node for a run whose asset takes no CoordinatorResource (a stream without a lock):
    a session of its own (ZooKeeper from the settings), connected in the background, for the block."""
    holder = CoordinatorResource(lake=lake)
    run = context.run
    holder.register_run(run.run_id, run_labels(run.job_name, run.tags), connect_in_background=True)
    try:
        yield
    finally:
        holder.close()


def liveness_probe(lake: LakeResource) -> CoordinatorResource:
    """For a sensor without a CoordinatorResource: ZooKeeper and the orphan bound from the settings."""
    return CoordinatorResource(lake=lake)


def _launched_at(instance: DagsterInstance, run_id: str) -> float | None:
    return instance.get_run_stats(run_id).launch_time


def _last_event_at(instance: DagsterInstance, run_id: str) -> float | None:
    records = instance.get_records_for_run(run_id, limit=1, ascending=False).records
    return records[0].timestamp if records else None
