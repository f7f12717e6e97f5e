"""The Dagster side every stream shares: what its sensor does with a batch that is planned but not
done yet, and how its run reports the tables it committed.

Batches of a stream commit strictly in order (their ids are the Delta txn versions), so a sensor
plans the next batch only once the latest is done. Until then it waits for the run in flight, or
requests the same plan again after a failure, up to MAX_ATTEMPTS; then the stream pauses with a
SkipReason until someone re-executes that partition.

A run first acquires the job coordinator (`coordinated_batch`). When the coordinator gives up (lock
timeout, predecessor mismatch, ZooKeeper unreachable) or the lease is lost before a commit, the run
fails without committing anything more and is tagged COORDINATION_TAG; such runs do not count
towards MAX_ATTEMPTS (the batch is not at fault, it waits its turn), so the sensor keeps requesting
the same plan on later ticks. They still number the attempts, so every retry has a new run key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dagster import (
    AssetExecutionContext,
    AssetMaterialization,
    DagsterRunStatus,
    DynamicPartitionsDefinition,
    Failure,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
)

from engagement_platform.resources import CoordinatorResource
from engagement_platform.streams.batch import fenced
from engagement_platform.streams.coordinator import CoordinationGaveUp, Lease, LeaseLost
from engagement_platform.streams.planning import BatchPlan

STREAM_TAG = "engagement/stream"  # dagster.yaml limits runs to one per value of this tag
MAX_ATTEMPTS = 3
UNFINISHED = {
    DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING,
}
FAILED = {DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
COORDINATION_TAG = "engagement/coordination"  # "gave_up" | "lease_lost" on runs that ended that way


def run_request(plan: BatchPlan, attempt: int, tags: dict[str, str]) -> RunRequest:
    return RunRequest(
        # The first attempt's key is the slice itself; a retry appends the attempt number, which is
        # derived from the failed runs recorded for this partition, not from the clock.
        run_key=plan.run_key if attempt == 1 else f"{plan.run_key}#attempt{attempt}",
        partition_key=plan.partition_key,
        tags={STREAM_TAG: plan.stream, "engagement/batch_id": str(plan.batch_id), **tags},
    )


def resume_unfinished(
    context: SensorEvaluationContext,
    latest: BatchPlan,
    partitions: DynamicPartitionsDefinition,
    tags: Callable[[BatchPlan], dict[str, str]],
    cursor: str,
    predecessor_wait: Callable[[BatchPlan], str | None] | None = None,
) -> SensorResult | SkipReason:
    """The sensor's answer while `latest` is planned but not done. After a coordination give-up,
    `predecessor_wait` (CoordinatorResource.predecessor_wait) holds the retry while it would give up
    again, so a stream waiting for its turn skips ticks instead of launching failing runs."""
    runs = context.instance.get_runs(filters=RunsFilter(tags={"dagster/partition": latest.partition_key, STREAM_TAG: latest.stream}))
    if any(r.status in UNFINISHED for r in runs):
        return SkipReason(f"{latest.stream} batch {latest.batch_id} is in flight")
    ended = [r for r in runs if r.status in FAILED]
    failed = sum(COORDINATION_TAG not in r.tags for r in ended)  # coordination give-ups are not attempts
    if failed >= MAX_ATTEMPTS:
        return SkipReason(f"{latest.stream} batch {latest.batch_id} failed {failed} times; "
                          f"stream paused until partition {latest.partition_key} is re-executed")
    last = ended[0] if ended else None  # get_runs lists the newest first
    if last is not None and last.tags.get(COORDINATION_TAG) == "gave_up" and predecessor_wait is not None:
        reason = predecessor_wait(latest)
        if reason:
            return SkipReason(f"{latest.stream} batch {latest.batch_id} waits for its turn: {reason}")
    return SensorResult(
        run_requests=[run_request(latest, len(ended) + 1, tags(latest))],
        dynamic_partitions_requests=[partitions.build_add_request([latest.partition_key])],
        cursor=cursor,
    )


def report_table_commits(context: AssetExecutionContext, stream: str, batch_id: int, versions: dict[str, int | None], **extra) -> None:
    """A stream run reports a materialization of each table it committed (the tables are downstream assets)."""
    for table, version in versions.items():
        context.log_event(AssetMaterialization(
            asset_key=table, description=f"{stream} batch {batch_id}",
            metadata={"batch_id": batch_id, "table_version": version if version is not None else "already committed", "stream": stream, **extra},
        ))


@contextmanager
def coordination_failures(context: AssetExecutionContext, what: str, then: str, **metadata) -> Iterator[None]:
    """A give-up or a lost lease inside the block ends the run as a Failure tagged COORDINATION_TAG
    (not retried by Dagster: the sensor decides), saying `what` gave up and what happens `then`."""
    try:
        yield
    except (CoordinationGaveUp, LeaseLost) as e:
        outcome = "gave_up" if isinstance(e, CoordinationGaveUp) else "lease_lost"
        context.instance.add_run_tags(context.run_id, {COORDINATION_TAG: outcome})
        raise Failure(
            description=f"{what} {outcome.replace('_', ' ')}: {e}. Nothing more was committed{then}.",
            metadata={"coordination": outcome, "reason": str(e), **metadata},
            allow_retries=False,
        ) from e


@contextmanager
def coordinated_batch(context: AssetExecutionContext, coordinator: CoordinatorResource, stream: str,
                      lock_name: str | None = None) -> Iterator[Lease | None]:
    """acquire -> the block (compute and commit, fenced by the lease) -> release, for the run's
    partition (= batch id). A give-up or a lost lease ends the run as a Failure tagged
    COORDINATION_TAG: nothing (more) is committed and a later tick retries the same plan."""
    batch_id = int(context.partition_key)
    with coordination_failures(context, f"{stream} batch {batch_id}: coordinator", "; a later tick retries the batch from its plan",
                               batch_id=batch_id):
        with coordinator.batch(stream, batch_id, lock_name) as lease, fenced(lease):
            if lease is not None:
                context.log.info(f"{stream} batch {batch_id}: holding {lease}")
            yield lease


def cursor_ahead_of_store(cursor: str | None, stream: str, latest: BatchPlan | None) -> str | None:
    """Why a sensor must not plan: its JSON cursor names a batch the checkpoint store never planned.

    A sensor records each plan before it returns the cursor naming it, so the store knows every batch a
    cursor names. A cursor ahead of the store means the lake was reset or the lake resource points at
    another lake. Planning batch 1 again there would re-read the source into it under partition keys and
    run keys this Dagster instance already used (a run request with a used run key is silently dropped,
    so the stream would stall without a word); skipping with this reason says what to do instead."""
    if not cursor:
        return None
    named = json.loads(cursor).get("batch_id")
    known = latest.batch_id if latest is not None else 0
    if not isinstance(named, int) or named <= known:
        return None
    return (f"{stream}: the sensor's cursor names batch {named} but the checkpoint store's latest batch is {known or 'none'}: "
            f"the lake was reset or the lake resource points at another lake. Reset this sensor's cursor to start {stream} over in this lake.")
