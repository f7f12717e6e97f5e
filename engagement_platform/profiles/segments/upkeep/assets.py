"""Compaction of segment membership in Dagster: profile_segments_compaction, one partition per tenant, folds the
tenant's change log (`profile_segment_changes`) into its compacted base (`profile_segments`), so a read of its
members merges only the log written since. The work is compaction.py's; here it runs under the tenant lock the
way a processor run takes it (waiting its turn, riding out passing faults), and its check replays the tenant's
whole log to the base's compaction point and compares that with the base.

A sensor requests a tenant's compaction once EP_SEGMENTS_COMPACT_LOG_ROWS log rows wait past its base and no run
of the tenant is in flight; a daily schedule requests every tenant with any, so a quiet tenant's readers never
merge more than a day of log. A tick that finds the log where it was reads two commit files (lake/table_cache.py),
not the tables' statistics.
"""

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetSelection,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    MaterializeResult,
    RunRequest,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SkipReason,
    asset,
    define_asset_job,
    in_process_executor,
    schedule,
    sensor,
)

from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.table_cache import TABLES
from engagement_platform.orchestration.parts import Parts, combine
from engagement_platform.orchestration.runs import STREAM_TAG
from engagement_platform.profiles.assets import (
    GROUP,
    PROCESSOR_JOB,
    SEGMENTS_ASSET,
    SEGMENTS_JOB,
    profile_tenants,
    tenant_locked,
    tenants_in_flight,
)
from engagement_platform.profiles.segments.compaction import COMPACTION, Compacted, compact_tenants, log_rows_pending
from engagement_platform.profiles.segments.current import BASE_COLUMNS, current_membership
from engagement_platform.profiles.segments.membership_files import MembershipFiles
from engagement_platform.profiles.segments.stored import read_stored
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS
from engagement_platform.resources import CoordinatorResource, LakeResource, SparkResource
from engagement_platform.settings import load_settings

COMPACTION_ASSET = AssetKey(COMPACTION)
COMPACTION_JOB = f"{COMPACTION}_job"
BASE_EQUALS_MERGED = "base_equals_merged_membership"
# Runs that work on a tenant's membership: the sensor leaves a tenant alone while one of them is in flight.
MEMBERSHIP_JOBS = (PROCESSOR_JOB, SEGMENTS_JOB, COMPACTION_JOB)


def compaction_stream(tenant: str) -> str:
    """The runs' stream tag: dagster.yaml then runs one compaction of a tenant at a time."""
    return f"{COMPACTION}/{tenant}"


def pending_log_rows(store: DeltaLake, tenants: list[str]) -> dict[str, int]:
    """log_rows_pending of these tenants, read again only after the log or the base moved. The log's answer is
    memoized on its log; the base's mark is part of the key, since a compaction changes the answer without
    touching the log (None while the base does not exist yet)."""
    base = TABLES.mark(store, PROFILE_SEGMENTS.name)
    key = ("segment log rows pending", tuple(tenants), base)
    return TABLES.memo(store, [PROFILE_SEGMENT_CHANGES.name], key, lambda: log_rows_pending(store, tenants))


def member_rows(table) -> list[tuple]:
    return list(zip(*(table[c].to_pylist() for c in BASE_COLUMNS)))


def base_equals_merged(store: DeltaLake, tenant: str) -> AssetCheckResult:
    """The tenant's base rows against its whole log replayed up to the batch the base is compacted through.
    Taken under the tenant lock: an erasure (which rewrites both tables under it) between the two reads would
    otherwise show as a difference. segment_members reads the base itself at its own compaction point, so the
    replay is read here the way it replays the log for an earlier batch."""
    files = MembershipFiles(store)
    through = files.through(tenant)
    log = read_stored((), files.all_log(tenant), store.storage_options)
    replayed = set(member_rows(current_membership(log.base, log.log, as_of_batch=through)))
    base = (
        member_rows(store.read(PROFILE_SEGMENTS.name, filters=[("tenant", "=", tenant)], columns=BASE_COLUMNS))
        if store.exists(PROFILE_SEGMENTS.name)
        else []
    )
    in_base = set(base)
    missing, extra, duplicates = len(replayed - in_base), len(in_base - replayed), len(base) - len(in_base)
    return AssetCheckResult(
        check_name=BASE_EQUALS_MERGED,
        passed=missing == extra == duplicates == 0,
        metadata={
            "members": len(base),
            "missing": missing,
            "extra": extra,
            "duplicates": duplicates,
            "through": through,
            "log_rows_replayed": log.log.num_rows,
        },
    )


@asset(
    key=COMPACTION_ASSET,
    deps=[SEGMENTS_ASSET],
    partitions_def=profile_tenants,
    group_name=GROUP,
    kinds={"spark", "deltalake"},
    check_specs=[
        AssetCheckSpec(
            BASE_EQUALS_MERGED,
            asset=COMPACTION_ASSET,
            description="The tenant's compacted base equals its whole change log replayed to the base's compaction "
            "point (rows missing from the base, extra in it, duplicated).",
        )
    ],
)
def profile_segments_compaction(
    context: AssetExecutionContext, spark: SparkResource, lake: LakeResource, coordinator: CoordinatorResource
) -> MaterializeResult:
    """One tenant's segment change log folded into its compacted membership base, under the tenant lock."""
    tenant = context.partition_key
    owner = f"{compaction_stream(tenant)}/{context.run_id[:8]}"
    folded: list[Compacted] = []  # kept across attempts: a retried attempt finds the first one's commit done

    def attempt() -> AssetCheckResult:
        # The tenant lock is tenant_locked's (held for the compaction and the check): compact_tenants takes none.
        folded.extend(compact_tenants(spark.spark_session, lake.lake, [tenant], None, owner))
        return base_equals_merged(lake.lake, tenant)

    check = tenant_locked(context, coordinator, spark, tenant, owner, attempt)
    metadata = (
        folded[-1].metadata()
        if folded
        else {"tenant": tenant, "log_rows_folded": 0, "note": "nothing pending: no log rows past the base"}
    )
    return MaterializeResult(metadata=metadata, check_results=[check])


profile_segments_compaction_job = define_asset_job(
    COMPACTION_JOB,
    selection=AssetSelection.assets(COMPACTION_ASSET),  # with its check
    partitions_def=profile_tenants,
    executor_def=in_process_executor,
    description="Fold one tenant's segment change log into its membership base, under the tenant lock.",
)


def compaction_request(tenant: str, trigger: str | None) -> RunRequest:
    return RunRequest(
        run_key=f"{compaction_stream(tenant)}/{trigger}" if trigger else None,
        partition_key=tenant,
        tags={STREAM_TAG: compaction_stream(tenant)},
    )


@sensor(job=profile_segments_compaction_job, minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING)
def profile_segments_compaction_sensor(context: SensorEvaluationContext, lake: LakeResource):
    """A compaction per tenant with EP_SEGMENTS_COMPACT_LOG_ROWS log rows or more past its base and no run of the
    tenant in flight; the run key names the log's version, so a re-evaluated tick requests nothing twice."""
    store = lake.lake
    log_version = TABLES.version(store, PROFILE_SEGMENT_CHANGES.name)
    if log_version is None:
        return SkipReason("no segment change is logged yet")
    bound = max(load_settings().profiles.segments_compact_log_rows, 1)
    tenants = sorted(context.instance.get_dynamic_partitions(profile_tenants.name))
    due = sorted(t for t, rows in pending_log_rows(store, tenants).items() if rows >= bound)
    if not due:
        return SkipReason(f"no tenant has {bound} log rows or more past its base")
    busy = tenants_in_flight(context.instance, MEMBERSHIP_JOBS)
    requests = [compaction_request(t, f"changes@{log_version}") for t in due if t not in busy]
    return requests or SkipReason(f"each tenant due has a run in flight: {', '.join(due)}")


@schedule(
    job=profile_segments_compaction_job,
    cron_schedule="7 4 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
)
def profile_segments_compaction_schedule(context: ScheduleEvaluationContext, lake: LakeResource):
    """Daily: a compaction of every tenant with any log rows past its base, however few. Runs of the tenant's
    processor or evaluation do not hold it back (a busy tenant always has one): it waits for the tenant lock."""
    tenants = sorted(context.instance.get_dynamic_partitions(profile_tenants.name))
    pending = sorted(t for t, rows in pending_log_rows(lake.lake, tenants).items() if rows > 0)
    busy = tenants_in_flight(context.instance, (COMPACTION_JOB,))
    when = context.scheduled_execution_time  # None only when evaluated by hand outside the daemon
    day = f"daily@{when.date().isoformat()}" if when is not None else None
    requests = [compaction_request(t, day) for t in pending if t not in busy]
    return requests or SkipReason("no tenant without a compaction in flight has log rows past its base")


COMPACTION_PARTS = Parts(
    assets=[profile_segments_compaction],
    jobs=[profile_segments_compaction_job],
    sensors=[profile_segments_compaction_sensor],
    schedules=[profile_segments_compaction_schedule],
)


def with_compaction(evaluation: Parts) -> Parts:
    """The segments stream's parts: its evaluation's, and the compaction of what the evaluations log."""
    return Parts(**combine(evaluation, COMPACTION_PARTS))
