"""Daily engagement metrics in Dagster: the incremental-read pattern end to end, as a downstream asset.

`engagement_daily_metrics` depends on engagement_activity and engagement_notifications; its sensor requests
a refresh when the notification table has moved past the metrics' checkpoint (run key = that notification
version, so a re-evaluated tick cannot request it twice), and every refresh checks its totals against a full
recomputation of engagement_activity at the version the metrics reflect, which Spark tasks compute
(recompute.py: the driver only sums per-task aggregates).
"""

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetSelection,
    DefaultSensorStatus,
    MaterializeResult,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    asset,
    define_asset_job,
    in_process_executor,
    sensor,
)

from engagement_platform.engagement.assets import GROUP
from engagement_platform.engagement.metrics.apply import (
    DAILY_METRICS,
    checkpoint_of,
    compare_with_recomputation,
    refresh_daily_metrics,
)
from engagement_platform.engagement.metrics.recompute import recomputed_metrics
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_NOTIFICATIONS
from engagement_platform.lake.table_cache import TABLES
from engagement_platform.orchestration.parts import Parts
from engagement_platform.orchestration.runs import STREAM_TAG, UNFINISHED
from engagement_platform.resources import LakeResource, SparkResource

METRICS_ASSET = AssetKey(DAILY_METRICS.name)
EQUALS_RECOMPUTATION = "daily_metrics_equal_full_recomputation"


@asset(
    key=METRICS_ASSET,
    deps=[AssetKey(ENGAGEMENT_ACTIVITY.name), AssetKey(ENGAGEMENT_NOTIFICATIONS.name)],
    group_name=GROUP,
    kinds={"spark", "deltalake"},
    check_specs=[
        AssetCheckSpec(
            EQUALS_RECOMPUTATION,
            asset=METRICS_ASSET,
            description="Every (org, day, activity type) equals a full GROUP BY of engagement_activity at the version the metrics reflect.",
        )
    ],
    description=DAILY_METRICS.description
    + " An example consumer of changes_since: its checkpoint is stored exactly once with its data.",
)
def engagement_daily_metrics(
    context: AssetExecutionContext, lake: LakeResource, spark: SparkResource
) -> MaterializeResult:
    refresh = refresh_daily_metrics(lake.lake)
    recomputed = recomputed_metrics(
        spark.spark_session, lake.lake, refresh.activity_version
    )  # Spark tasks read the table
    compared = compare_with_recomputation(lake.lake, refresh.reflected, recomputed)
    context.log.info(
        f"daily metrics: notifications {refresh.checkpoint_before} -> {refresh.checkpoint}, {refresh.changed_rows} "
        f"changed rows, {refresh.keys_changed} keys; {compared.keys_differing} keys differ from a recomputation"
    )
    check = AssetCheckResult(
        check_name=EQUALS_RECOMPUTATION,
        passed=compared.passed,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "activity_version": compared.reflected.version,
            "unread_activity_versions": str(list(compared.reflected.unread)),
            "oldest_unread_age_s": round(compared.oldest_unread_age_s or 0.0, 1),
            "problem": compared.problem or "none",
            "keys": compared.keys,
            "activities_expected": compared.activities_expected,
            "activities_stored": compared.activities_stored,
            "keys_differing": compared.keys_differing,
            "differing_sample": str(compared.sample),
        },
    )
    return MaterializeResult(
        metadata={**refresh.metadata(), "activities": compared.activities_stored, "keys": compared.keys},
        check_results=[check],
    )


METRICS_STREAM = "daily_metrics"  # one refresh at a time (dagster.yaml's limit per stream tag)
engagement_daily_metrics_job = define_asset_job(
    "engagement_daily_metrics_job",
    selection=AssetSelection.assets(METRICS_ASSET),  # with its check
    executor_def=in_process_executor,
    tags={STREAM_TAG: METRICS_STREAM},
    description="Fold engagement_activity's changes since the last refresh into engagement_daily_metrics.",
)


@sensor(job=engagement_daily_metrics_job, minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING)
def engagement_daily_metrics_sensor(context: SensorEvaluationContext, lake: LakeResource):
    """Requests a refresh when engagement_notifications has a version the metrics have not read. Both versions
    come from lake/table_cache.py: an idle tick costs a stat call on each table's log, not a load of either."""
    store = lake.lake
    latest = TABLES.version(store, ENGAGEMENT_NOTIFICATIONS.name)
    if latest is None:
        return SkipReason("no notifications yet")
    read_up_to = TABLES.memo(store, [DAILY_METRICS.name], "daily metrics: checkpoint", lambda: checkpoint_of(store))
    if latest <= read_up_to:
        return SkipReason(f"the metrics have read every notification (version {read_up_to})")
    if context.instance.get_run_records(
        RunsFilter(job_name=engagement_daily_metrics_job.name, statuses=list(UNFINISHED)), limit=1
    ):
        return SkipReason("a refresh is in flight")
    return RunRequest(
        run_key=f"{METRICS_STREAM}/notifications@{latest}", tags={"engagement/notifications_version": str(latest)}
    )


METRICS = Parts(
    assets=[engagement_daily_metrics], jobs=[engagement_daily_metrics_job], sensors=[engagement_daily_metrics_sensor]
)
