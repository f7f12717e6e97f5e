"""Asset surface of the unified-profile CDC lake: its group, asset keys, tenant partitions, the tenant
lock as a run's coordination, and the tables no stream asset stands for.

kafka/profile_cdc -> profile_cdc_staging (dumper, staging/: one partition per planned offset slice)
                  -> profile_raw (processor, processor/: one partition per tenant = one Delta table per tenant)
profile_backfill (backfill/: one partition per tenant, config: export path + time boundary) -> profile_raw

The staging table has one writer, so the dumper stream *is* the staging asset. The raw tables have
two writers (processor and backfill) and an asset key has one producer: the processor owns
`profile_raw`, the backfill is its own asset upstream of it and reports a `profile_raw`
materialization of the tenant for every commit it makes. Both take the tenant lock.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TypeVar

from dagster import AssetExecutionContext, AssetKey, AssetSpec, DagsterInstance, DynamicPartitionsDefinition, RunsFilter

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.orchestration.parts import Parts
from engagement_platform.orchestration.ride_out import ride_out, spark_reconnect
from engagement_platform.orchestration.runs import UNFINISHED
from engagement_platform.orchestration.topics import Watermarks
from engagement_platform.profiles.lag import staged_offsets, topic_lag
from engagement_platform.profiles.locks import tenant_lock, tenant_locks
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, PROFILE_PROGRESS, QUARANTINE_PROFILE_CDC
from engagement_platform.resources import CoordinatorResource, SparkResource, holder_owner
from engagement_platform.streams.batch import AllLeases
from engagement_platform.streams.coordinator import Lease, LockBusy

GROUP = "profiles"
TOPIC_ASSET = AssetKey(["kafka", "profile_cdc"])
STAGING_ASSET = AssetKey(PROFILE_CDC_STAGING.name)
RAW_ASSET = AssetKey("profile_raw")
BACKFILL_ASSET = AssetKey("profile_backfill")
SEGMENTS_ASSET = AssetKey("profile_segments")
# A processor run merges its tenants' staged changes and then evaluates their segments in the same process (one
# run per group of tenants and staging batch instead of two); the segments job alone follows the other raw writers.
PROCESSOR_JOB = "profile_processor_job"
SEGMENTS_JOB = "profile_segments_job"
# One per tenant: the processor sensor adds a tenant when its first changes are staged.
profile_tenants = DynamicPartitionsDefinition(name="profile_tenants")
T = TypeVar("T")
# Dagster's run tags for a run of one partition, and of a partition range (a processor run of many tenants).
PARTITION_TAG = "dagster/partition"
RANGE_START_TAG, RANGE_END_TAG = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def cdc_lag_metadata(watermarks: Watermarks, staged: dict[int, int]) -> dict:
    """The topic's CDC lag (messages not staged yet), in total and per partition."""
    lag = topic_lag(watermarks, staged)
    return {"cdc_lag_messages": sum(lag.values()), **{f"partition_{p}_lag": n for p, n in lag.items()}}


def cdc_observation_metadata(checkpoints: CheckpointStore, watermarks: Watermarks) -> dict:
    """What an observation of the CDC topic adds to its watermarks: its lag behind the dumper's last done batch."""
    return cdc_lag_metadata(watermarks, staged_offsets(checkpoints))


def run_tenants(tags: Mapping[str, str], keys: Sequence[str]) -> list[str]:
    """The tenants a run of a tenant-partitioned job covers, from its tags: its partition, or every tenant of
    its partition range in `keys` (the tenant partitions in the order they were added, which is a range's
    order); [] for a run with neither."""
    if PARTITION_TAG in tags:
        return [tags[PARTITION_TAG]]
    start, end = tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)
    if start is None or end is None or start not in keys or end not in keys:
        return []
    return list(keys[keys.index(start) : keys.index(end) + 1])


def tenants_in_flight(
    instance: DagsterInstance, job_names: tuple[str, ...] = (PROCESSOR_JOB, SEGMENTS_JOB)
) -> set[str]:
    """Tenants with an unfinished run of any of these jobs (a run of a partition range covers each tenant of
    the range). Both jobs evaluate a tenant's segments, and two evaluations of one tenant at once would clean
    up each other's uncommitted files: neither sensor requests a run for a tenant another run is working on."""
    runs = [
        r for name in job_names for r in instance.get_runs(filters=RunsFilter(job_name=name, statuses=list(UNFINISHED)))
    ]
    keys = instance.get_dynamic_partitions(profile_tenants.name) if any(RANGE_START_TAG in r.tags for r in runs) else []
    return {tenant for r in runs for tenant in run_tenants(r.tags, keys)}


def tenants_metadata(
    context: AssetExecutionContext, tenants: list[str], of_tenant: Callable[[str], dict], run_wide: dict
) -> dict:
    """The output metadata of a run's materializations of tenant partitions: a run of one tenant reports its
    figures with the run's; a run of many gives each tenant partition its own figures (Dagster adds the returned
    run-wide metadata to every partition's materialization)."""
    if len(tenants) == 1:
        return {**of_tenant(tenants[0]), **run_wide}
    for tenant in tenants:
        context.add_asset_metadata(of_tenant(tenant), partition_key=tenant)
    return {"tenants_in_run": len(tenants), **run_wide}


def tenant_locked(
    context: AssetExecutionContext,
    coordinator: CoordinatorResource,
    spark: SparkResource,
    tenants: str | list[str],
    owner: str,
    attempt: Callable[[], T],
) -> T:
    """`attempt()` under the locks of `tenants` (one tenant, or a run's partition range: taken in sorted order,
    commits fenced by all of them), riding out passing faults (ride_out: a lost lease, ZooKeeper, the broker or
    Spark away) for `ride_out_faults_s`, each new attempt planned afresh from the tenants' progress (so what an
    earlier attempt committed is skipped) and on a new Spark session after Spark was away. While another run
    holds a tenant's lock, the run waits its turn (a log line per round of the lock timeout) up to the
    coordinator's `max_lock_wait_s` per lock; the seconds it waited become the materialization's
    LOCK_WAIT_METADATA. Only a give-up after that, or faults past the bound, fail the run tagged
    COORDINATION_TAG / UNAVAILABLE_TAG with nothing (more) committed: the next tick asks again."""
    tenants = [tenants] if isinstance(tenants, str) else tenants
    zk = coordinator.coordinator() if coordinator.is_enabled else None

    def waiting(busy: LockBusy, waited_s: float) -> None:
        context.log.info(
            f"{owner} waits for its turn: tenant lock {busy.lock_name} held by {holder_owner(busy.holder or 'unknown')} "
            f"({waited_s:.0f}s so far, gives up after {coordinator.max_lock_wait_s:g}s)"
        )

    @contextmanager
    def hold() -> Iterator[Lease | AllLeases | None]:
        if len(tenants) == 1:
            locked = tenant_lock(
                zk, tenants[0], owner, coordinator.lock_timeout_s, coordinator.max_lock_wait_s, waiting
            )
        else:
            locked = tenant_locks(zk, tenants, owner, coordinator.lock_timeout_s, coordinator.max_lock_wait_s, waiting)
        with locked as lease:
            if lease is not None:
                context.log.info(f"{owner}: holding {lease.lock_name} after waiting {lease.waited_s:.1f}s")
            yield lease

    return ride_out(
        context,
        f"{owner}: tenant lock" + ("s" if len(tenants) > 1 else ""),
        attempt,
        hold,
        coordinator.ride_out_faults_s,
        spark_reconnect(spark),
        tenant=tenants[0] if len(tenants) == 1 else f"{tenants[0]}..{tenants[-1]} ({len(tenants)} tenants)",
    )


profile_tables = [
    AssetSpec(
        key=PROFILE_PROGRESS.name,
        deps=[RAW_ASSET],
        group_name=GROUP,
        kinds={"deltalake"},
        description="Progress map: per tenant and processor batch, the staging versions and buckets merged into its raw table.",
    ),
    AssetSpec(
        key=QUARANTINE_PROFILE_CDC.name,
        deps=[STAGING_ASSET, BACKFILL_ASSET],
        group_name=GROUP,
        kinds={"deltalake"},
        description="CDC records and snapshot rows that never reached a table: raw bytes, topic:partition:offset or file:line, reason.",
    ),
]
PROFILE_TABLES = Parts(assets=profile_tables)
