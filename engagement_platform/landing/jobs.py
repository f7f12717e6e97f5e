"""One job per pipeline, in-process (Spark is the long-lived Connect server), one run at a time per
pipeline (the stream tag's concurrency limit in dagster.yaml); and everything one pipeline adds to the
Definitions; and the daily landing retention (landing/retention.py)."""

from datetime import timedelta

from dagster import (
    AssetExecutionContext,
    AssetSelection,
    DefaultScheduleStatus,
    MaterializeResult,
    RunRequest,
    asset,
    define_asset_job,
    in_process_executor,
    schedule,
)

from engagement_platform.ingest.config import PipelineConfig, load_pipelines
from engagement_platform.landing.apply import stream_name
from engagement_platform.landing.assets import GROUP, pipeline_assets, pipeline_key
from engagement_platform.landing.partitions import pipeline_batches
from engagement_platform.landing.retention import expire_landed_files
from engagement_platform.landing.sensors import landing_sensor
from engagement_platform.orchestration.parts import Parts
from engagement_platform.orchestration.runs import STREAM_TAG
from engagement_platform.resources import LakeResource
from engagement_platform.settings import load_settings


def pipeline_job(config: PipelineConfig):
    return define_asset_job(
        f"ingest_{config.name}_job",
        selection=AssetSelection.assets(pipeline_key(config)),
        partitions_def=pipeline_batches(config),
        executor_def=in_process_executor,
        tags={STREAM_TAG: stream_name(config)},
        description=f"Run pipeline {config.name} on one batch of landing files.",
    )


def pipeline_parts(config: PipelineConfig) -> Parts:
    """The pipeline's assets (landing folder, pipeline, tables), its job and its landing sensor."""
    job = pipeline_job(config)
    return Parts(assets=pipeline_assets(config), jobs=[job], sensors=[landing_sensor(config, job)])


# ---- landing retention (landing/retention.py): landed files already ingested leave within the erasure window

LANDING_RETENTION = "landing_retention"


@asset(key=LANDING_RETENTION, group_name=GROUP, kinds={"python"})
def landing_retention(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    """Landed files already ingested by a done batch, deleted once older than half of EP_ERASURE_WINDOW."""
    settings = load_settings()
    older_than = timedelta(seconds=settings.erasure.retention_seconds)
    deleted = expire_landed_files(
        settings.landing_root, load_pipelines(settings.pipelines_dir), lake.checkpoints, older_than
    )
    return MaterializeResult(metadata={"files_deleted": len(deleted), "older_than_seconds": older_than.total_seconds()})


landing_retention_job = define_asset_job(
    "landing_retention_job",
    selection=[LANDING_RETENTION],
    description="Delete landed files already ingested, once older than half the erasure window.",
)


@schedule(
    job=landing_retention_job,
    cron_schedule="37 3 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
)
def landing_retention_schedule(context):
    """Daily, like the lakes' upkeeps: the erasure window holds while it runs at least once per half window."""
    return RunRequest()


LANDING_UPKEEP = Parts(assets=[landing_retention], jobs=[landing_retention_job], schedules=[landing_retention_schedule])
