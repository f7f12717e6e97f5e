"""Landing retention in Dagster: a daily asset that deletes the landed files done batches ingested, once
older than half the erasure window (landing/retention.py)."""

from datetime import timedelta

from dagster import AssetExecutionContext, DefaultScheduleStatus, MaterializeResult, RunRequest, asset, define_asset_job, schedule

from engagement_platform.ingest.config import load_pipelines
from engagement_platform.landing.assets import GROUP
from engagement_platform.landing.retention import expire_landed_files
from engagement_platform.orchestration.parts import Parts
from engagement_platform.resources import LakeResource
from engagement_platform.settings import load_settings

LANDING_RETENTION = "landing_retention"


@asset(key=LANDING_RETENTION, group_name=GROUP, kinds={"python"})
def landing_retention(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    """Landed files already ingested by a done batch, deleted once older than half of EP_ERASURE_WINDOW."""
    settings = load_settings()
    older_than = timedelta(seconds=settings.erasure.retention_seconds)
    deleted = expire_landed_files(settings.landing_root, load_pipelines(settings.pipelines_dir), lake.checkpoints, older_than)
    return MaterializeResult(metadata={"files_deleted": len(deleted), "older_than_seconds": older_than.total_seconds()})


landing_retention_job = define_asset_job("landing_retention_job", selection=[LANDING_RETENTION],
                                         description="Delete landed files already ingested, once older than half the erasure window.")


@schedule(job=landing_retention_job, cron_schedule="37 3 * * *", execution_timezone="UTC", default_status=DefaultScheduleStatus.RUNNING)
def landing_retention_schedule(context):
    """Daily, like the lakes' upkeeps: the erasure window holds while it runs at least once per half window."""
    return RunRequest()


LANDING_UPKEEP = Parts(assets=[landing_retention], jobs=[landing_retention_job], schedules=[landing_retention_schedule])
