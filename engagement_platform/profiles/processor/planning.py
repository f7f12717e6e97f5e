"""The processor's plans: per tenant, the next slice of staging table versions to merge.

A tenant's slice is the staging versions (after, up_to]: after its last planned batch, up to the
current version. It is stored in the checkpoint store before any work, like a Kafka slice, so a
re-run after a crash reads exactly the same staging files. Every tenant is its own stream
(`profile_processor/<tenant>`); many tenants are planned from one checkpoint read and their new
plans stored in one checkpoint commit.
"""

from __future__ import annotations

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.profiles.snapshots import SnapshotListings
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, validate_tenant
from engagement_platform.streams.planning import BatchPlan, TableVersionsSlice


def processor_stream(tenant: str) -> str:
    return f"profile_processor/{validate_tenant(tenant)}"


def processor_group_stream(tenants: list[str]) -> str:
    """A run's stream: the tenant's, or "profile_processor/<first>..<last>" for a run of a range of tenants."""
    return processor_stream(tenants[0]) if len(tenants) == 1 else f"{processor_stream(tenants[0])}..{tenants[-1]}"


def processor_app_id(tenant: str) -> str:
    return f"profile.processor/{validate_tenant(tenant)}"


def staging_slice(plan: BatchPlan) -> TableVersionsSlice:
    """The staging versions (after, up_to] a processor plan merges."""
    return plan.slice_as(TableVersionsSlice)


def staging_listings(lake: DeltaLake) -> SnapshotListings:
    return SnapshotListings(lake, PROFILE_CDC_STAGING.name)


def plan_tenant_batch(lake: DeltaLake, checkpoints: CheckpointStore, tenant: str) -> BatchPlan | None:
    """The tenant's unfinished plan if there is one (a crashed run resumes it), else a new slice of
    staging versions; None when nothing was staged for the tenant since its last batch."""
    return plan_tenant_batches(lake, checkpoints, [tenant]).get(tenant)


def plan_tenant_batches(
    lake: DeltaLake, checkpoints: CheckpointStore, tenants: list[str], listings: SnapshotListings | None = None
) -> dict[str, BatchPlan]:
    """plan_tenant_batch for many tenants at once: one read of the checkpoint rows, one listing per
    staging snapshot needed (`listings`, shared with the caller), and the new plans stored in one
    checkpoint commit (one txn per tenant's plan, so each plan is still stored exactly once)."""
    if not tenants:
        return {}
    streams = {t: processor_stream(t) for t in tenants}
    latest = checkpoints.latest_of(list(streams.values()))
    listings = listings or staging_listings(lake)
    current = lake.table(PROFILE_CDC_STAGING.name).version() if lake.exists(PROFILE_CDC_STAGING.name) else -1
    plans: dict[str, BatchPlan] = {}
    new: list[BatchPlan] = []
    for tenant, stream in streams.items():
        plan, done = latest[stream]
        if plan is not None and not done:
            plans[tenant] = plan
            continue
        after = staging_slice(plan).up_to if plan is not None else -1
        if not listings.added(tenant, after, current):
            continue
        plans[tenant] = BatchPlan(
            stream,
            plan.batch_id + 1 if plan is not None else 1,
            TableVersionsSlice(PROFILE_CDC_STAGING.name, after, current),
        )
        new.append(plans[tenant])
    checkpoints.record_plans(new)
    return {t: plans[t] for t in tenants if t in plans}
