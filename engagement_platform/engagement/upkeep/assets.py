"""Layout upkeep of engagement_activity in Dagster: compaction + z-order by engagement_date per org, vacuum.

The work and the layout report are in lake/layout.py and plan.py (no Dagster); this module runs them as
an asset, checks the result, and triggers it after every UPKEEP_EVERY_BATCHES completed ingestion and
mutation batches (sensor) plus once a day (schedule, the backstop for vacuum and for writers the sensor
does not count). Both start RUNNING: a sensor tick is one read of the checkpoint partition, and a run
rewrites only the partitions that need it, so an idle lake costs one short run a day.
"""

import json

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetSelection,
    Config,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    MaterializeResult,
    MetadataValue,
    RunRequest,
    RunsFilter,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset,
    asset_check,
    define_asset_job,
    in_process_executor,
    schedule,
    sensor,
)

from engagement_platform.engagement.assets import GROUP, REWRITE_POOL
from engagement_platform.engagement.ingestion.apply import STREAM as INGESTION_STREAM
from engagement_platform.engagement.mutation.apply import STREAM as MUTATION_STREAM
from engagement_platform.engagement.retention.erasure import VACUUMED_TABLES, WINDOW_TABLES
from engagement_platform.engagement.retention.tables import QUARANTINE_ENGAGEMENT_GDPR
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_ERASED_SUBJECTS
from engagement_platform.engagement.upkeep.plan import (
    batches_since,
    completed_batches,
    layout_markdown,
    layout_summary,
    max_of,
    upkeep_metadata,
)
from engagement_platform.lake.layout import partition_layout, upkeep
from engagement_platform.lake.row_erasure import expire_logs, purge_quarantine, vacuum_tables
from engagement_platform.lake.suppression_tables import load_suppressed
from engagement_platform.orchestration.parts import Parts
from engagement_platform.orchestration.runs import UNFINISHED
from engagement_platform.resources import LakeResource
from engagement_platform.settings import load_settings
from engagement_platform.spark.handoff_files import sweep_all_handoffs

UPKEEP_ASSET = AssetKey("engagement_layout_upkeep")
DATE_RANGES_DO_NOT_OVERLAP = "date_ranges_do_not_overlap"
FILE_COUNT_UNDER_LIMIT = "file_count_under_limit"
UPKEEP_TAG = "engagement/upkeep"
UPKEEP_EVERY_BATCHES = 50
COUNTED_STREAMS = (INGESTION_STREAM, MUTATION_STREAM)  # streams whose completed batches the sensor counts
WORST_SHOWN = 5
PURGE_APP_ID = "engagement.upkeep.purge"


class LayoutUpkeepConfig(Config):
    """Upkeep and check thresholds; the asset and both checks take the same fields."""

    target_file_mb: int = 1024
    vacuum_retention_hours: int | None = None  # None: EP_VACUUM_RETENTION_HOURS at run time (default 168)
    max_overlap_ratio: float = 0.1
    max_files_per_partition: int = 100
    vacuum_full: bool = True
    org_ids: list[str] = []  # empty: every org partition


@asset(
    key=UPKEEP_ASSET,
    deps=[AssetKey(ENGAGEMENT_ACTIVITY.name)],
    group_name=GROUP,
    kinds={"deltalake"},
    pool=REWRITE_POOL,
)
def engagement_layout_upkeep(
    context: AssetExecutionContext, config: LayoutUpkeepConfig, lake: LakeResource
) -> MaterializeResult:
    """Per org partition of engagement_activity: files, mean file size and engagement_date overlap after compaction, z-ordering and vacuum."""
    retention_hours = (
        load_settings().retention.vacuum_retention_hours
        if config.vacuum_retention_hours is None
        else config.vacuum_retention_hours
    )
    erasure = load_settings().erasure
    # a malformed or repeated erasure request naming a subject a later request erased is kept raw until here
    purged = purge_quarantine(
        lake.lake,
        QUARANTINE_ENGAGEMENT_GDPR,
        load_suppressed(lake.lake, ENGAGEMENT_ERASED_SUBJECTS, erasure.secret),
        PURGE_APP_ID,
    )
    result = upkeep(
        lake.lake,
        ENGAGEMENT_ACTIVITY,
        partitions=config.org_ids or None,
        target_file_bytes=config.target_file_mb * 1024 * 1024,
        vacuum_retention_hours=retention_hours,
        max_overlap_ratio=config.max_overlap_ratio,
        vacuum_full=config.vacuum_full,
    )
    # GDPR erasure (the retention stream) also deletes from these tables (engagement_activity's change log
    # included): the same full vacuum makes the erased rows' files (data and change data) go once the retention has passed.
    others = vacuum_tables(lake.lake, [t for t in VACUUMED_TABLES if t != ENGAGEMENT_ACTIVITY.name], retention_hours)
    # ...and their log entries older than half the erasure window go too (statistics in add actions hold ids),
    # with the handoff folders a crashed run left: nothing of an erased subject outlives EP_ERASURE_WINDOW.
    expired = expire_logs(lake.lake, WINDOW_TABLES, erasure.retention_seconds)
    swept = sweep_all_handoffs(lake.lake.root, erasure.handoff_age, lake.lake.storage_options)
    if result["partitions_conflicted"]:
        context.log.warning(f"commit conflicts, left for the next run: {result['partitions_conflicted']}")
    metadata, worst = upkeep_metadata(result, others, retention_hours, WORST_SHOWN)
    context.log_event(
        AssetObservation(
            asset_key=AssetKey(ENGAGEMENT_ACTIVITY.name),
            metadata={
                "files": result["files_after"],
                **layout_summary(result["layout_after"]),
                "table_version": result["version_after"],
            },
        )
    )
    return MaterializeResult(
        metadata={
            **metadata,
            "worst_partitions": MetadataValue.md(worst),
            "logs_expired": sum(v >= 0 for v in expired.values()),
            "log_expiry_conflicts": sum(v < 0 for v in expired.values()),
            "handoff_folders_swept": len(swept),
            "quarantined_requests_purged": purged,
            "erasure_window_seconds": erasure.window_seconds,
        }
    )


@asset_check(
    asset=UPKEEP_ASSET,
    name=DATE_RANGES_DO_NOT_OVERLAP,
    blocking=False,
    description="No org partition's files overlap in engagement_date by more than max_overlap_ratio (warns).",
)
def date_ranges_do_not_overlap(config: LayoutUpkeepConfig, lake: LakeResource) -> AssetCheckResult:
    layout = partition_layout(lake.lake, ENGAGEMENT_ACTIVITY.name)  # sorted worst overlap first
    over = [r for r in layout.to_pylist() if r["overlap_ratio"] > config.max_overlap_ratio]
    return AssetCheckResult(
        passed=not over,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "max_overlap_ratio": max_of(layout, "overlap_ratio"),
            "threshold": config.max_overlap_ratio,
            "partitions_over_threshold": len(over),
            "partitions": layout.num_rows,
            "worst_partitions": MetadataValue.md(layout_markdown(layout.slice(0, WORST_SHOWN))),
        },
    )


@asset_check(
    asset=UPKEEP_ASSET,
    name=FILE_COUNT_UNDER_LIMIT,
    blocking=False,
    description="No org partition of engagement_activity has more than max_files_per_partition files (warns).",
)
def file_count_under_limit(config: LayoutUpkeepConfig, lake: LakeResource) -> AssetCheckResult:
    layout = partition_layout(lake.lake, ENGAGEMENT_ACTIVITY.name)
    layout = layout.sort_by([("files", "descending")])
    over = [r for r in layout.to_pylist() if r["files"] > config.max_files_per_partition]
    return AssetCheckResult(
        passed=not over,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "max_files_per_partition": int(max_of(layout, "files")),
            "threshold": config.max_files_per_partition,
            "partitions_over_limit": len(over),
            "small_files": sum(layout["small_files"].to_pylist()),
            "worst_partitions": MetadataValue.md(layout_markdown(layout.slice(0, WORST_SHOWN))),
        },
    )


layout_upkeep_job = define_asset_job(
    "layout_upkeep_job",
    selection=AssetSelection.assets(UPKEEP_ASSET),  # with its checks
    executor_def=in_process_executor,
    tags={UPKEEP_TAG: ENGAGEMENT_ACTIVITY.name},
    description="Compact and z-order engagement_activity per org by engagement_date, vacuum, report the layout.",
)


def _in_flight(instance) -> bool:
    return bool(
        instance.get_run_records(RunsFilter(job_name=layout_upkeep_job.name, statuses=list(UNFINISHED)), limit=1)
    )


@sensor(job=layout_upkeep_job, minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING)
def layout_upkeep_sensor(context: SensorEvaluationContext, lake: LakeResource):
    """Requests layout upkeep of engagement_activity after every UPKEEP_EVERY_BATCHES completed batches."""
    done = {stream: completed_batches(lake.checkpoints, stream) for stream in COUNTED_STREAMS}
    new = batches_since(done, json.loads(context.cursor)["done"] if context.cursor else {})
    if new < UPKEEP_EVERY_BATCHES:
        return SkipReason(f"{new} batches completed since the last upkeep request; upkeep every {UPKEEP_EVERY_BATCHES}")
    if _in_flight(context.instance):
        return SkipReason("an upkeep run is still in flight")
    # The run key is the batch position that triggered it: a re-evaluated tick cannot request it twice.
    run_key = "layout_upkeep/" + ",".join(f"{s}@{b}" for s, b in sorted(done.items()))
    tags = {f"{UPKEEP_TAG}/trigger": "batches", **{f"{UPKEEP_TAG}/{s}_batch": str(b) for s, b in done.items()}}
    return SensorResult(
        run_requests=[RunRequest(run_key=run_key, tags=tags)],
        cursor=json.dumps({"done": done}),
    )


@schedule(
    job=layout_upkeep_job,
    cron_schedule="17 3 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
)
def layout_upkeep_schedule(context: ScheduleEvaluationContext):
    """Daily upkeep: vacuum, plus any partition rewritten by writers the sensor does not count."""
    if _in_flight(context.instance):
        return SkipReason("an upkeep run is still in flight")
    return RunRequest(tags={f"{UPKEEP_TAG}/trigger": "schedule"})


UPKEEP_ASSETS = [engagement_layout_upkeep]
UPKEEP_CHECKS = [date_ranges_do_not_overlap, file_count_under_limit]
UPKEEP_JOBS = [layout_upkeep_job]
UPKEEP_SCHEDULES = [layout_upkeep_schedule]
UPKEEP_SENSORS = [layout_upkeep_sensor]
UPKEEP = Parts(
    assets=UPKEEP_ASSETS,
    asset_checks=UPKEEP_CHECKS,
    jobs=UPKEEP_JOBS,
    sensors=UPKEEP_SENSORS,
    schedules=UPKEEP_SCHEDULES,
)
