"""Sensors of the profile processor: runs for the tenants with unmerged staged changes (consecutive tenants
share a run, a partition range of up to EP_PROFILE_TENANTS_PER_RUN), and the lag monitor (the replication
lag of every tenant as one check, and the topic's CDC lag, every minute).

A tenant's run in flight whose process is gone (no liveness node in ZooKeeper: a crash of the Dagster
host) is marked failed and the tenant requested again; such attempts do not count towards the pause.

Both sensors' questions of the staging and progress tables are kept (lake/table_cache.py) until either table
moves, so a tick of an idle lake costs a stat call on each table's log; the lag monitor reports what changed."""

import json
from itertools import takewhile

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.table_cache import TABLES
from engagement_platform.orchestration.orphans import reap_orphans, retry_tags
from engagement_platform.orchestration.parts import Parts
from engagement_platform.orchestration.reported import unreported
from engagement_platform.orchestration.runs import (
    FAILED,
    MAX_ATTEMPTS,
    STREAM_TAG,
    UNFINISHED,
    backoff_wait,
    counts_as_attempt,
    unless_unavailable,
)
from engagement_platform.orchestration.topics import topic_observation
from engagement_platform.profiles.assets import (
    PARTITION_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    SEGMENTS_JOB,
    TOPIC_ASSET,
    cdc_observation_metadata,
    profile_tenants,
    run_tenants,
    tenants_in_flight,
)
from engagement_platform.profiles.lag import tenant_lags
from engagement_platform.profiles.processor.apply import processor_group_stream, processor_stream
from engagement_platform.profiles.processor.assets import profile_processor_job, profile_raw
from engagement_platform.profiles.processor.checks import every_tenant_lag_check, every_tenant_lag_evaluation
from engagement_platform.profiles.processor.grouping import newest_failed, tenant_groups
from engagement_platform.profiles.processor.progress import latest_progress, unprocessed_tenants
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, PROFILE_PROGRESS
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource
from engagement_platform.settings import load_settings

STAGING_RANGE_TAG = "profile/staging_versions"  # "<after>-<up to>" as the sensor saw them
STAGING_AND_PROGRESS = (PROFILE_CDC_STAGING.name, PROFILE_PROGRESS.name)  # what the processor's questions read
# The processor's latest runs searched for each tenant's newest outcome, and a retried tenant's latest runs for
# deaths since its last success (enough to reach the longest backoff).
RECENT_RUNS = 100


def processor_run_key(tenant: str, after: int, up_to: int, attempt: int) -> str:
    """From the tenant and the staging versions it has to merge, never from the clock."""
    key = f"{processor_stream(tenant)}/staging[{after + 1}..{up_to}]"
    return key if attempt == 1 else f"{key}#attempt{attempt}"


def _unprocessed(store: DeltaLake) -> tuple[list[str], int, dict[str, int]]:
    """(tenants with unmerged staged changes, the staging version, each tenant's merged staging version). Kept
    (table_cache) until staging or progress moves: an idle tick costs a stat call on each table's log."""
    tenants = unprocessed_tenants(store)
    if not tenants:
        return [], -1, {}
    current = store.table(PROFILE_CDC_STAGING.name).version()
    return tenants, current, {t: r["staging_version"] for t, r in latest_progress(store).items()}


def group_run_key(group: list[str], progress: dict[str, int], up_to: int) -> str:
    """A run of several tenants: from the tenants, the staging versions the first of them starts after and
    the staging version they merge up to, never from the clock."""
    after = min(progress.get(t, -1) for t in group)
    return f"{processor_group_stream(group)}/staging[{after + 1}..{up_to}]"


@sensor(job=profile_processor_job, minimum_interval_seconds=10, default_status=DefaultSensorStatus.RUNNING)
def profile_processor_sensor(context: SensorEvaluationContext, coordinator: CoordinatorResource):
    """Requests processor runs for the tenants whose staged changes are not all merged into their raw tables:
    consecutive tenants share a run (up to EP_PROFILE_TENANTS_PER_RUN, a partition range); a tenant whose last
    run failed is retried in a run of its own, with the attempts, backoff and pause of a single batch."""
    store = coordinator.lake.lake
    tenants, current, progress = TABLES.memo(
        store, STAGING_AND_PROGRESS, "profile processor: unprocessed tenants", lambda: _unprocessed(store)
    )
    if not tenants:
        return SkipReason("every tenant's staged changes are merged")
    instance = context.instance
    running = instance.get_runs(filters=RunsFilter(job_name=profile_processor_job.name, statuses=list(UNFINISHED)))
    running, note = reap_orphans(instance, running, coordinator)  # runs whose process is gone are failed here
    known = instance.get_dynamic_partitions(profile_tenants.name)
    added = set(known)
    new = [t for t in tenants if t not in added]
    order = [*known, *new]  # a range's order: the partitions as added, the ones this tick adds last
    in_flight = {t for r in running for t in run_tenants(r.tags, known)} | tenants_in_flight(instance, (SEGMENTS_JOB,))
    retried = newest_failed((run_tenants(r.tags, known), r.status in FAILED) for r in latest_runs(instance))
    requests: list[RunRequest] = []
    waiting: list[str] = []
    ready: list[str] = []

    def alone(tenant: str) -> None:
        """A run of the tenant alone, or why not now."""
        request = retry_request(instance, tenant, progress.get(tenant, -1), current)
        if isinstance(request, RunRequest):
            requests.append(request)
        else:
            waiting.append(request)

    for tenant in tenants:
        if tenant in in_flight:
            waiting.append(f"{tenant}: in flight" + (f" ({note})" if note else ""))
        elif tenant not in retried:
            ready.append(tenant)
        else:
            alone(tenant)
    for group in tenant_groups(ready, order, load_settings().profiles.tenants_per_run):
        if len(group) == 1:  # a run of its own: its attempts are counted as a retry's
            alone(group[0])
            continue
        span = f"{min(progress.get(t, -1) for t in group)}-{current}"
        requests.append(
            RunRequest(
                run_key=group_run_key(group, progress, current),
                tags={
                    STREAM_TAG: processor_group_stream(group),
                    STAGING_RANGE_TAG: span,
                    RANGE_START_TAG: group[0],
                    RANGE_END_TAG: group[-1],
                },
            )
        )
    # Progress (in the lake) decides what runs, so a lost cursor never skips a tenant; the cursor records
    # what this tick saw, for the UI.
    cursor = json.dumps({"staging_version": current, "tenants": {t: progress.get(t, -1) for t in tenants}})
    return SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[profile_tenants.build_add_request(new)] if new else [],
        skip_reason=None if requests else "; ".join(waiting),
        cursor=cursor,
    )


def latest_runs(instance: DagsterInstance) -> list[DagsterRun]:
    """The processor's latest runs, newest first: the last RECENT_RUNS of any outcome and the last RECENT_RUNS
    failed ones (a paused tenant's failures stay in view while many healthy runs pass)."""
    job = RunsFilter(job_name=profile_processor_job.name)
    failed = RunsFilter(job_name=profile_processor_job.name, statuses=list(FAILED))
    records = {
        r.dagster_run.run_id: r for f in (job, failed) for r in instance.get_run_records(filters=f, limit=RECENT_RUNS)
    }
    return [r.dagster_run for r in sorted(records.values(), key=lambda r: r.create_timestamp, reverse=True)]


def tenant_request(tenant: str, after: int, current: int, attempt: int, tags: dict[str, str]) -> RunRequest:
    return RunRequest(
        run_key=processor_run_key(tenant, after, current, attempt),
        partition_key=tenant,
        tags={STREAM_TAG: processor_stream(tenant), STAGING_RANGE_TAG: f"{after}-{current}", **tags},
    )


def retry_request(instance: DagsterInstance, tenant: str, after: int, current: int) -> RunRequest | str:
    """A run of its own for a tenant whose last run failed, or why none now: paused after MAX_ATTEMPTS
    failures on the same staging versions (lock give-ups and orphans are not the batch's fault), or backing off."""
    span = f"{after}-{current}"
    ended = instance.get_runs(
        filters=RunsFilter(
            job_name=profile_processor_job.name,
            statuses=list(FAILED),
            tags={PARTITION_TAG: tenant, STAGING_RANGE_TAG: span},
        )
    )
    if sum(counts_as_attempt(r) for r in ended) >= MAX_ATTEMPTS:
        return f"{tenant}: failed {MAX_ATTEMPTS} times on staging versions {span}, paused until re-executed"
    # Deaths count since the tenant's last success, not per span: staging grows while the runs keep dying.
    recent = instance.get_runs(
        filters=RunsFilter(job_name=profile_processor_job.name, tags={PARTITION_TAG: tenant}), limit=RECENT_RUNS
    )
    since_success = list(takewhile(lambda r: r.status != DagsterRunStatus.SUCCESS, recent))
    backing_off = backoff_wait(instance, [r for r in since_success if r.status in FAILED], tenant)
    if backing_off:
        return backing_off
    return tenant_request(tenant, after, current, len(ended) + 1, retry_tags(recent[0] if recent else None))


@sensor(minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING)
def profile_lag_sensor(context: SensorEvaluationContext, kafka: KafkaResource, lake: LakeResource):
    """Every minute: the replication lag of every tenant as the `every_tenant_replication_lag_under_threshold`
    check of profile_progress (freshness-style: it is evaluated while no run happens too), and the topic's CDC lag;
    each reported when its figures changed since the last report."""
    tenants = sorted(context.instance.get_dynamic_partitions(profile_tenants.name))

    # The lag check comes from the lake alone: it is reported while the broker is away too (lag grows then). The
    # lags are kept (table_cache) until staging or progress moves; the threshold is read on every tick.
    evaluations = []
    if tenants:
        lags = TABLES.memo(
            lake.lake,
            STAGING_AND_PROGRESS,
            ("profile lag: tenant lags", tuple(tenants)),
            lambda: tenant_lags(lake.lake, tenants),
        )
        evaluations = [every_tenant_lag_evaluation(lags)]

    def observe():
        marks = kafka.client.watermarks(load_settings().profiles.cdc_topic)
        return topic_observation(marks, TOPIC_ASSET, cdc_observation_metadata(lake.checkpoints, marks))

    observed = unless_unavailable(observe)
    if isinstance(observed, SkipReason):
        changed, cursor = unreported(context.cursor, evaluations)
        return SensorResult(asset_events=changed, skip_reason=observed.skip_message, cursor=cursor)
    changed, cursor = unreported(context.cursor, [observed, *evaluations])
    reason = None if changed else "nothing changed since the last report"
    return SensorResult(
        asset_events=changed, skip_reason=reason if tenants else "no tenant partitions yet", cursor=cursor
    )


PROCESSOR = Parts(
    assets=[profile_raw],
    asset_checks=[every_tenant_lag_check],
    jobs=[profile_processor_job],
    sensors=[profile_processor_sensor, profile_lag_sensor],
)
