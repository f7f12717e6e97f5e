"""The Dagster side every stream shares: what its sensor does with a batch that is planned but not
done yet, and how its run reports the tables it committed.

Batches of a stream commit strictly in order (their ids are the Delta txn versions), so a sensor
plans the next batch only once the latest is done. Until then it waits for the run in flight, or
requests the same plan again after a failure, up to MAX_ATTEMPTS; then the stream pauses with a
SkipReason until someone re-executes that partition.
"""

from __future__ import annotations

from collections.abc import Callable

from dagster import AssetExecutionContext, AssetMaterialization, DagsterRunStatus, DynamicPartitionsDefinition, RunRequest, RunsFilter, SensorEvaluationContext, SensorResult, SkipReason

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


def report_table_commits(context: AssetExecutionContext, stream: str, batch_id: int, versions: dict[str, int | None], **extra) -> None:
    """A stream run reports a materialization of each table it committed (the tables are downstream assets)."""
    for table, version in versions.items():
        context.log_event(AssetMaterialization(
            asset_key=table, description=f"{stream} batch {batch_id}",
            metadata={"batch_id": batch_id, "table_version": version if version is not None else "already committed", "stream": stream, **extra},
        ))
