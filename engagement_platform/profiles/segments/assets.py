"""Segments in Dagster: profile_segments, one partition per tenant, downstream of the raw tables; a sensor
requests a tenant's evaluation once its raw table moved past the last evaluated version (the processor,
backfill or an erasure committed) and no run of the tenant is in flight: the processor's run evaluates the
segments itself right after its merge, so this sensor only follows the other writers. Each run reports identities evaluated, segments, entries, exits and
every segment's size (plotted over runs), and warns when a path a scalar op reads held arrays; its check
re-evaluates a sample of identities with the slow reference evaluator and compares with the committed membership.

The definitions (EP_SEGMENTS_DIR) are loaded when the code location loads: a file with a problem fails
the load, one line per problem, and `dagster dev` shows it."""

import random

import pyarrow.compute as pc
from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetSelection,
    DefaultSensorStatus,
    MaterializeResult,
    RunRequest,
    SensorEvaluationContext,
    SkipReason,
    asset,
    define_asset_job,
    in_process_executor,
    sensor,
)

from engagement_platform.lake.delta import text_column
from engagement_platform.lake.table_cache import TABLES
from engagement_platform.orchestration.parts import Parts
from engagement_platform.orchestration.runs import STREAM_TAG
from engagement_platform.profiles.assets import (
    GROUP,
    RAW_ASSET,
    SEGMENTS_ASSET,
    SEGMENTS_JOB,
    profile_tenants,
    tenants_in_flight,
    tenants_metadata,
)
from engagement_platform.profiles.segments.apply import (
    evaluate_tenants,
    plan_evaluations,
    segments_app_id,
    segments_stream,
)
from engagement_platform.profiles.segments.definitions import load_segments
from engagement_platform.profiles.segments.read import segment_members
from engagement_platform.profiles.segments.reference import members
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES
from engagement_platform.profiles.tables import raw_table_name
from engagement_platform.resources import LakeResource, SparkResource
from engagement_platform.settings import load_settings
from engagement_platform.streams.pin import pin_batch
from engagement_platform.streams.slices import TableVersionsSlice

MATCHES_REFERENCE = "membership_matches_reference"
SAMPLE = 500
CHECKED_TENANTS = 3  # tenants whose sample a run of a range of tenants checks against the reference

load_segments(load_settings().profiles.segments_dir)  # every file checked when the code location loads


@asset(
    key=SEGMENTS_ASSET,
    deps=[RAW_ASSET],
    partitions_def=profile_tenants,
    group_name=GROUP,
    kinds={"spark", "deltalake"},
    check_specs=[
        AssetCheckSpec(
            MATCHES_REFERENCE,
            asset=SEGMENTS_ASSET,
            description=f"On a sample of {SAMPLE} identities, the committed membership equals the slow reference's.",
        )
    ],
)
def profile_segments(context: AssetExecutionContext, spark: SparkResource, lake: LakeResource) -> MaterializeResult:
    """Segment membership of one tenant: every segment evaluated over every merged profile in one pass. A run of
    a range of tenants (a processor run) evaluates them all in one Spark job, a batch per tenant."""
    tenants = list(context.partition_keys)
    segments = {t: load_segments(load_settings().profiles.segments_dir, t) for t in tenants}
    plans = plan_evaluations(lake.lake, lake.checkpoints, tenants)
    batches = [(t, plan, segments[t]) for t, plan in plans.items() if plan is not None]
    results = {r.tenant: r for r in evaluate_tenants(spark.spark_session, lake.lake, lake.checkpoints, batches)}
    for result in results.values():
        for warning in result.warnings:  # in the run's log as well as in the metadata (`warnings`)
            context.log.warning(warning)

    def tenant_metadata(tenant: str) -> dict:
        result = results.get(tenant)
        idle = {"tenant": tenant, "segments": len(segments[tenant]), "identities_evaluated": 0}
        return result.metadata() if result is not None else idle

    # The reference check re-reads a sample of identities: in a run of many tenants, a few chosen by the run.
    checked = sorted(random.Random(context.run_id).sample(sorted(results), min(CHECKED_TENANTS, len(results))))
    checks = [sample_check(lake, t, plans[t], segments[t], results[t].plan.batch_id) for t in checked]
    check = AssetCheckResult(
        check_name=MATCHES_REFERENCE,
        passed=all(c["missing"] == c["extra"] == 0 for c in checks),
        metadata={
            **{key: sum(c[key] for c in checks) for key in ("sampled", "missing", "extra")},
            **({"tenants_checked": ", ".join(checked)} if len(tenants) > 1 else {}),
        },
    )
    run_wide = {"tenants_evaluated": len(results)} if len(tenants) > 1 else {}
    return MaterializeResult(
        metadata=tenants_metadata(context, tenants, tenant_metadata, run_wide), check_results=[check]
    )


def sample_check(lake: LakeResource, tenant: str, plan, segments, batch_id: int) -> dict[str, int]:
    """The committed membership of a sample of identities against the reference evaluation of the same raw
    version at the batch's pinned evaluation time: identities sampled, memberships missing and extra."""
    store = lake.lake
    raw = plan.slice_as(TableVersionsSlice)
    dataset = store.table(raw.table, raw.up_to).to_pyarrow_dataset()
    live = pc.field("deleted").is_null() | ~pc.field("deleted")
    keys = sorted(
        set(dataset.to_table(columns=["component_id"], filter=live)["component_id"].to_pylist())
    )  # one column, not the rows
    chosen = random.Random(batch_id).sample(keys, min(SAMPLE, len(keys)))
    identities: dict[str, list[dict]] = {key: [] for key in chosen}
    # Compared through a cast: files a delta-rs MERGE rewrote store strings as string_view.
    for r in dataset.to_table(
        filter=live & text_column("component_id").isin(chosen)
    ).to_pylist():  # only the sample's rows
        identities[r["component_id"]].append(r)
    sample = identities
    now = pin_batch(
        store, PROFILE_SEGMENT_CHANGES.name, segments_app_id(tenant), batch_id, []
    ).as_of  # the evaluation's pinned time
    members_of_sample = segment_members(store, tenant, as_of_batch=batch_id, identities=chosen)
    committed = set(zip(members_of_sample["segment"].to_pylist(), members_of_sample["identity"].to_pylist()))
    expected = {(s.name, key) for s in segments for key in members(s, sample, now)}
    return {"sampled": len(sample), "missing": len(expected - committed), "extra": len(committed - expected)}


profile_segments_job = define_asset_job(
    SEGMENTS_JOB,
    selection=AssetSelection.assets(SEGMENTS_ASSET),
    partitions_def=profile_tenants,
    executor_def=in_process_executor,
    description="Evaluate every segment of one tenant.",
)


@sensor(job=profile_segments_job, minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING)
def profile_segments_sensor(context: SensorEvaluationContext, lake: LakeResource):
    """One evaluation per tenant whose raw table moved past the version its last evaluation read, unless a
    run of the tenant (a processor run evaluates too) is in flight."""
    store, requests = lake.lake, []
    busy = tenants_in_flight(context.instance)
    tenants = context.instance.get_dynamic_partitions(profile_tenants.name)
    # One read of the checkpoint table for every tenant's last evaluation, and each raw table's version from its
    # log's mark (table_cache: two small reads): a tick over a thousand idle tenants costs no table load.
    latest = lake.checkpoints.latest_of([segments_stream(t) for t in tenants])
    for tenant in tenants:
        if tenant in busy or (current := TABLES.version(store, raw_table_name(tenant))) is None:
            continue
        plan, _ = latest[segments_stream(tenant)]
        evaluated = plan.slice_as(TableVersionsSlice).up_to if plan else -1
        if current > evaluated:
            requests.append(
                RunRequest(
                    run_key=f"{segments_stream(tenant)}/raw@{current}",
                    partition_key=tenant,
                    tags={STREAM_TAG: segments_stream(tenant)},
                )
            )
    return requests or SkipReason("every tenant's segments are evaluated at its raw table's current version")


SEGMENTS = Parts(assets=[profile_segments], jobs=[profile_segments_job], sensors=[profile_segments_sensor])
