"""What every stream's sensor does with a batch that is planned but not done yet (Dagster side).

Batches of a stream commit strictly in order (their ids are the Delta txn versions), so a sensor
plans the next batch only once the latest is done. Until then it waits for the run in flight, or
requests the same plan again after a failure, up to MAX_ATTEMPTS; then the stream pauses with a
SkipReason until someone re-executes that partition.
"""

from __future__ import annotations

from collections.abc import Callable

from dagster import DagsterRunStatus, DynamicPartitionsDefinition, RunRequest, RunsFilter, SensorEvaluationContext, SensorResult, SkipReason

from engagement_platform.streams.planning import BatchPlan

STREAM_TAG = "engagement/stream"  # dagster.yaml limits runs to one per value of this tag
MAX_ATTEMPTS = 3
UNFINISHED = {
    DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING,
}
FAILED = {DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


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
) -> SensorResult | SkipReason:
    """The sensor's answer while `latest` is planned but not done."""
    runs = context.instance.get_runs(filters=RunsFilter(tags={"dagster/partition": latest.partition_key, STREAM_TAG: latest.stream}))
    if any(r.status in UNFINISHED for r in runs):
        return SkipReason(f"{latest.stream} batch {latest.batch_id} is in flight")
    failed = sum(r.status in FAILED for r in runs)
    if failed >= MAX_ATTEMPTS:
        return SkipReason(f"{latest.stream} batch {latest.batch_id} failed {failed} times; "
                          f"stream paused until partition {latest.partition_key} is re-executed")
    return SensorResult(
        run_requests=[run_request(latest, failed + 1, tags(latest))],
        dynamic_partitions_requests=[partitions.build_add_request([latest.partition_key])],
        cursor=cursor,
    )
