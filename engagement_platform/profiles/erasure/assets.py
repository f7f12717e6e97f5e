"""Profile erasure in Dagster: topic profile.erasure -> profile_erasure (one partition per planned slice of
requests; each run takes the erasure lock, then its tenants' locks) -> the profile tables; and the profile
lake's daily upkeep (staging retention, vacuum, log expiry within the erasure window)."""

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetSpec,
    DefaultScheduleStatus,
    MaterializeResult,
    RunRequest,
    ScheduleEvaluationContext,
    asset,
    define_asset_job,
    in_process_executor,
    schedule,
)

from engagement_platform.orchestration.kafka_stream import KafkaStreamDefinition, build_kafka_stream
from engagement_platform.orchestration.parts import Parts
from engagement_platform.profiles.assets import GROUP, RAW_ASSET, STAGING_ASSET
from engagement_platform.profiles.erasure.apply import SPEC
from engagement_platform.profiles.erasure.checks import PROFILE_ERASURE_CHECKS
from engagement_platform.profiles.erasure.upkeep import profile_upkeep
from engagement_platform.profiles.tables import (
    PROFILE_ERASED_SUBJECTS,
    PROFILE_ERASURE_AUDIT,
    PROFILE_SUPPRESSED_RECORDS,
    QUARANTINE_PROFILE_ERASURE,
)
from engagement_platform.resources import CoordinatorResource, LakeResource
from engagement_platform.settings import load_settings

ERASURE_ASSET = AssetKey("profile_erasure")
UPKEEP_ASSET = AssetKey("profile_lake_upkeep")

PROFILE_ERASURE = build_kafka_stream(
    KafkaStreamDefinition(
        spec=SPEC,
        asset_key=ERASURE_ASSET,
        topic_asset_key=AssetKey(["kafka", "profile_erasure"]),
        topic=lambda: load_settings().profiles.erasure_topic,
        description="Profile erasure: each partition is one planned slice of erasure requests; every id of each requested identity "
        "goes from the raw table, staging and quarantine, and onto the suppression list (hashes only).",
        topic_description="Kafka topic of profile erasure requests: a tenant and an id (EP_PROFILE_ERASURE_TOPIC).",
        group=GROUP,
        checks=PROFILE_ERASURE_CHECKS,
        job_description="Apply one planned slice of profile erasure requests under the tenants' locks, with an audit row each.",
        sensor_description="Plans the next slice of profile.erasure when the previous erasure batch is done.",
        partitions_name="profile_erasure_batches",
    )
)


@asset(key=UPKEEP_ASSET, deps=[RAW_ASSET, STAGING_ASSET, ERASURE_ASSET], group_name=GROUP, kinds={"deltalake"})
def profile_lake_upkeep(
    context: AssetExecutionContext, lake: LakeResource, coordinator: CoordinatorResource
) -> MaterializeResult:
    """A purge of rows naming erased ids that raced their erasure, staging retention (merged buckets older than
    EP_PROFILE_STAGING_RETENTION), then vacuum and log expiry of the profile tables past half of EP_ERASURE_WINDOW,
    and the handoff sweep."""
    settings = load_settings()
    figures = profile_upkeep(
        lake.lake,
        settings.erasure,
        settings.profiles.staging_retention_seconds,
        settings.retention.vacuum_retention_hours,
        coordinator.coordinator() if coordinator.is_enabled else None,
    )
    if figures["log_expiry_conflicts"]:
        context.log.warning(
            f"{figures['log_expiry_conflicts']} log expiries conflicted with a writer; the next run retries them"
        )
    return MaterializeResult(
        metadata={**figures, "staging_retention_seconds": settings.profiles.staging_retention_seconds}
    )


profile_upkeep_job = define_asset_job(
    "profile_lake_upkeep_job",
    selection=[UPKEEP_ASSET],
    executor_def=in_process_executor,
    description="Profile lake upkeep: staging retention, vacuum and log expiry within the erasure window.",
)


@schedule(
    job=profile_upkeep_job,
    cron_schedule="47 3 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
)
def profile_upkeep_schedule(context: ScheduleEvaluationContext):
    """Daily: the erasure window's bound holds while the upkeep runs at least once per half window."""
    return RunRequest()


erasure_tables = [
    AssetSpec(
        key=PROFILE_ERASED_SUBJECTS.name,
        deps=[ERASURE_ASSET],
        group_name=GROUP,
        kinds={"deltalake"},
        description="The profile suppression list: each erased identity's ids as keyed hashes per tenant; the dumper and backfill drop their changes.",
    ),
    AssetSpec(
        key=PROFILE_SUPPRESSED_RECORDS.name,
        deps=[ERASURE_ASSET, STAGING_ASSET],
        group_name=GROUP,
        kinds={"deltalake"},
        description="Per batch: CDC changes and requests dropped because they named an erased id (hash and count only).",
    ),
    AssetSpec(
        key=PROFILE_ERASURE_AUDIT.name,
        deps=[ERASURE_ASSET],
        group_name=GROUP,
        kinds={"deltalake"},
        description="One row per applied profile erasure: the subject's hash, ids erased with it, rows removed per table.",
    ),
    AssetSpec(
        key=QUARANTINE_PROFILE_ERASURE.name,
        deps=[ERASURE_ASSET],
        group_name=GROUP,
        kinds={"deltalake"},
        description="Profile erasure requests that are malformed or repeated: raw request, position, reason.",
    ),
]
ERASURE = Parts(
    assets=[*PROFILE_ERASURE.assets, profile_lake_upkeep, *erasure_tables],
    jobs=[*PROFILE_ERASURE.jobs, profile_upkeep_job],
    sensors=PROFILE_ERASURE.sensors,
    schedules=[profile_upkeep_schedule],
)
