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

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from dagster import AssetExecutionContext, AssetKey, AssetSpec, DagsterInstance, DynamicPartitionsDefinition, RunsFilter

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.orchestration.parts import Parts
from engagement_platform.orchestration.ride_out import ride_out, spark_reconnect
from engagement_platform.orchestration.runs import UNFINISHED
from engagement_platform.orchestration.topics import Watermarks
from engagement_platform.profiles.lag import staged_offsets, topic_lag
from engagement_platform.profiles.locks import tenant_lock
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, PROFILE_PROGRESS, QUARANTINE_PROFILE_CDC
from engagement_platform.resources import CoordinatorResource, SparkResource, holder_owner
from engagement_platform.streams.coordinator import Lease, LockBusy

GROUP = "profiles"
TOPIC_ASSET = AssetKey(["kafka", "profile_cdc"])
STAGING_ASSET = AssetKey(PROFILE_CDC_STAGING.name)
RAW_ASSET = AssetKey("profile_raw")
BACKFILL_ASSET = AssetKey("profile_backfill")
SEGMENTS_ASSET = AssetKey("profile_segments")
# A processor run merges a tenant's staged changes and then evaluates its segments in the same process (one
# run per tenant per staging batch instead of two); the segments job alone follows the other raw writers.
PROCESSOR_JOB = "profile_processor_job"
SEGMENTS_JOB = "profile_segments_job"
# One per tenant: the processor sensor adds a tenant when its first changes are staged.
profile_tenants = DynamicPartitionsDefinition(name="profile_tenants")
T = TypeVar("T")


def cdc_lag_metadata(watermarks: Watermarks, staged: dict[int, int]) -> dict:
    """The topic's CDC lag (messages not staged yet), in total and per partition."""
    lag = topic_lag(watermarks, staged)
    return {"cdc_lag_messages": sum(lag.values()), **{f"partition_{p}_lag": n for p, n in lag.items()}}


def cdc_observation_metadata(checkpoints: CheckpointStore, watermarks: Watermarks) -> dict:
    """What an observation of the CDC topic adds to its watermarks: its lag behind the dumper's last done batch."""
    return cdc_lag_metadata(watermarks, staged_offsets(checkpoints))


def tenants_in_flight(
    instance: DagsterInstance, job_names: tuple[str, ...] = (PROCESSOR_JOB, SEGMENTS_JOB)
) -> set[str]:
    """Tenants with an unfinished run of any of these jobs. Both jobs evaluate a tenant's segments, and two
    evaluations of one tenant at once would clean up each other's uncommitted files: neither sensor requests
    a run for a tenant another run is working on."""
    return {
        r.tags.get("dagster/partition")
        for name in job_names
        for r in instance.get_runs(filters=RunsFilter(job_name=name, statuses=list(UNFINISHED)))
    }


def tenant_locked(
    context: AssetExecutionContext,
    coordinator: CoordinatorResource,
    spark: SparkResource,
    tenant: str,
    owner: str,
    attempt: Callable[[], T],
) -> T:
    """`attempt()` under the tenant lock (commits fenced), riding out passing faults (ride_out: a lost lease,
    ZooKeeper, the broker or Spark away) for `ride_out_faults_s`, each new attempt planned afresh from the
    tenant's progress (so what an earlier attempt committed is skipped) and on a new Spark session after
    Spark was away. While another run of the tenant holds the lock, the run waits its turn (a log line per
    round of the lock timeout) up to the coordinator's `max_lock_wait_s`; the seconds it waited become the
    materialization's LOCK_WAIT_METADATA. Only a give-up after that, or faults past the bound, fail the run
    tagged COORDINATION_TAG / UNAVAILABLE_TAG with nothing (more) committed: the next tick asks again."""
    zk = coordinator.coordinator() if coordinator.is_enabled else None

    def waiting(busy: LockBusy, waited_s: float) -> None:
        context.log.info(
            f"{owner} waits for its turn: tenant lock {busy.lock_name} held by {holder_owner(busy.holder or 'unknown')} "
            f"({waited_s:.0f}s so far, gives up after {coordinator.max_lock_wait_s:g}s)"
        )

    @contextmanager
    def hold() -> Iterator[Lease | None]:
        with tenant_lock(zk, tenant, owner, coordinator.lock_timeout_s, coordinator.max_lock_wait_s, waiting) as lease:
            if lease is not None:
                context.log.info(f"{owner}: holding {lease} after waiting {lease.waited_s:.1f}s for it")
            yield lease

    return ride_out(
        context,
        f"{owner}: tenant lock",
        attempt,
        hold,
        coordinator.ride_out_faults_s,
        spark_reconnect(spark),
        tenant=tenant,
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
