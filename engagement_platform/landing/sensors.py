"""Landing sensor of a pipeline: the files waiting become the next batch (up to the source's
max_files_per_batch / max_bytes_per_batch), one batch in flight at a time, so a backlog is caught up in a few runs.

A file is identified by path and size; files must be complete when they appear in the landing
folder (write elsewhere, then rename in). The checkpoint store, not the cursor, says which files
are already planned, so a lost cursor cannot ingest a file twice; the cursor is read only to catch a
lake that is not the one it planned in (runs.cursor_ahead_of_store), and to report the landing folder's
counts only when they changed (orchestration/reported.py). A run in flight whose process is
gone (no liveness node in ZooKeeper) is marked failed and its file requested again (orchestration/orphans.py).
"""

import json

from dagster import AssetObservation, DefaultSensorStatus, SensorEvaluationContext, SensorResult, SkipReason, sensor

from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.landing.apply import files_plan, landing_files, planned_files, stream_name
from engagement_platform.landing.assets import landing_key
from engagement_platform.landing.files import next_batch_files
from engagement_platform.landing.partitions import pipeline_batches
from engagement_platform.orchestration.reported import unreported
from engagement_platform.orchestration.runs import cursor_ahead_of_store, resume_unfinished, run_request
from engagement_platform.resources import CoordinatorResource
from engagement_platform.settings import load_settings
from engagement_platform.streams.planning import BatchPlan


def _tags(plan: BatchPlan) -> dict[str, str]:
    files = planned_files(plan)
    return {
        "ingest/file": files[0].path,
        "ingest/files": str(len(files)),
        "ingest/bytes": str(sum(f.size for f in files)),
    }


def _cursor(plan: BatchPlan) -> str:
    files = planned_files(plan)
    return json.dumps(
        {
            "batch_id": plan.batch_id,
            "files": len(files),
            "last_file": files[-1].path,
            "bytes": sum(f.size for f in files),
        }
    )


def landing_sensor(config: PipelineConfig, job):
    stream = stream_name(config)
    partitions = pipeline_batches(config)

    @sensor(
        name=f"ingest_{config.name}_landing_sensor",
        job=job,
        minimum_interval_seconds=10,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"New files under the landing root matching {config.source.path} -> the files waiting are the next batch of pipeline {config.name}.",
    )
    def _sensor(context: SensorEvaluationContext, coordinator: CoordinatorResource):
        store = coordinator.checkpoints
        latest, done = store.latest(stream)
        ahead = cursor_ahead_of_store(context.cursor, stream, latest)
        if ahead:
            return SkipReason(ahead)
        if latest is not None and not done:
            return resume_unfinished(context, latest, partitions, _tags, _cursor(latest), liveness=coordinator)
        files = landing_files(load_settings().landing_root, config)
        planned = {(f.path, f.size) for p in store.plans(stream) for f in planned_files(p)}
        waiting = [f for f in files if (f.path, f.size) not in planned]
        # Reported when a count changed since the report the cursor records: an idle tick writes nothing.
        observed, reported_cursor = unreported(
            context.cursor,
            [
                AssetObservation(
                    asset_key=landing_key(config), metadata={"files": len(files), "files_waiting": len(waiting)}
                )
            ],
        )
        if not waiting:
            return SensorResult(
                skip_reason=f"no new files for {config.name} ({len(files)} already ingested)",
                asset_events=observed,
                cursor=reported_cursor,
            )
        landed = next_batch_files(waiting, config.source.max_files_per_batch, config.source.max_bytes_per_batch)
        batch_id = (latest.batch_id + 1) if latest else 1
        # A run launched while another writer of the target holds its lock would only wait: plan it on a later tick.
        busy = coordinator.lock_wait(stream, batch_id, config.target.table)
        if busy:
            return SensorResult(
                skip_reason=f"{config.name} batch {batch_id} waits for its turn: {busy}",
                asset_events=observed,
                cursor=reported_cursor,
            )
        plan = files_plan(config, batch_id, [(f.path, f.size) for f in landed])
        store.record_plan(plan)
        return SensorResult(
            run_requests=[run_request(plan, 1, _tags(plan))],
            asset_events=observed,
            dynamic_partitions_requests=[partitions.build_add_request([plan.partition_key])],
            cursor=_cursor(plan),
        )

    return _sensor
