"""Progress map: per tenant, which staging versions (and buckets) are merged into its raw table.

One row per processor batch, appended in the same commit sequence as the raw MERGE (its own txn per
tenant), so the latest row of a tenant is its progress. The sensor asks `unprocessed_tenants`:
tenants with a staging commit newer than their progress, found from commit metadata (the dumper
names each commit's tenants) without reading any data file.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.delta import DeltaLake
from engagement_platform.profiles.staging.apply import TENANTS_KEY
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, PROFILE_PROGRESS


def latest_progress(lake: DeltaLake) -> dict[str, dict]:
    """tenant -> its latest progress row (as a dict)."""
    if not lake.exists(PROFILE_PROGRESS.name):
        return {}
    rows = lake.read(PROFILE_PROGRESS.name).sort_by([("tenant", "ascending"), ("batch_id", "ascending")]).to_pylist()
    return {r["tenant"]: r for r in rows}


def processed_version(lake: DeltaLake, tenant: str) -> int:
    """The staging version up to which `tenant` is merged (-1: nothing yet)."""
    row = latest_progress(lake).get(tenant)
    return row["staging_version"] if row else -1


def staged_tenants(lake: DeltaLake) -> set[str]:
    """Tenants with any file in the current staging snapshot."""
    actions = pa.table(lake.table(PROFILE_CDC_STAGING.name).get_add_actions(flatten=True))
    column = "partition.tenant" if "partition.tenant" in actions.column_names else "partition_values.tenant"
    return set(pc.unique(actions[column]).to_pylist()) if actions.num_rows else set()


def unprocessed_tenants(lake: DeltaLake) -> list[str]:
    """Tenants whose staging has changes committed after their progress version, sorted."""
    if not lake.exists(PROFILE_CDC_STAGING.name):
        return []
    staging = lake.table(PROFILE_CDC_STAGING.name)
    current = staging.version()
    progress = {t: r["staging_version"] for t, r in latest_progress(lake).items()}
    waiting = {t for t in staged_tenants(lake) if t not in progress}
    behind = {t: v for t, v in progress.items() if v < current}
    if behind:
        oldest = min(behind.values())
        for commit in lake.history(PROFILE_CDC_STAGING.name, since=oldest + 1):
            version = int(commit["version"])
            for tenant in filter(None, str(commit.get(TENANTS_KEY) or "").split(",")):
                if tenant in behind and version > behind[tenant]:
                    waiting.add(tenant)
    return sorted(waiting)
