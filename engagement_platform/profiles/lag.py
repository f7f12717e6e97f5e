"""Lag of the profile CDC lake, from metadata only (Kafka watermarks, checkpoints, Delta log stats).

CDC lag (messages): high watermarks of `profile.cdc` minus the end offsets of the dumper's last
*done* batch, per topic partition. It cannot be split by tenant without reading the unstaged
messages (tenants share partitions), so it is reported for the topic; per tenant we add the records
staged but not merged yet (`staged_unprocessed`: row counts of the staging files committed after the
tenant's progress version, from the Delta log). Together: work not yet in the raw table.

Replication lag (seconds), per tenant, as in Adobe's unified-profile talk: the newest CDC timestamp staged for the
tenant (staging file statistics) minus the newest CDC timestamp its processor merged (progress
map). A tenant never processed counts from its oldest staged change. Both are hot-store times, so the
number says how far the raw table trails the staged changes, not the wall clock (a tenant with no new
changes has no lag); changes still in Kafka show up in the CDC lag instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.profiles.staging.apply import STREAM
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, PROFILE_PROGRESS
from engagement_platform.settings import load_settings


def max_lag_seconds() -> float:
    """Replication lag above which a tenant's lag check fails (EP_PROFILE_MAX_LAG_SECONDS), read at run time."""
    return load_settings().profiles.max_lag_seconds


def staged_offsets(checkpoints: CheckpointStore, stream: str = STREAM) -> dict[int, int]:
    """partition -> next offset to stage: the end of the dumper's last finished batch ({} if none)."""
    plans = checkpoints.plans(stream)
    if not plans:
        return {}
    latest = plans[-1]
    if not checkpoints.is_done(stream, latest.batch_id):
        # Batches finish in order, so the one before the latest is done (or there is none).
        return plans[-2].ends() if len(plans) > 1 else {}
    return latest.ends()


def topic_lag(watermarks: dict[int, tuple[int, int]], staged: dict[int, int]) -> dict[int, int]:
    """partition -> messages on the topic not staged yet (retention-deleted offsets do not count)."""
    return {p: max(high - max(staged.get(p, low), low), 0) for p, (low, high) in sorted(watermarks.items())}


@dataclass(frozen=True)
class TenantLag:
    tenant: str
    staged_records: int
    staged_unprocessed: int
    max_staged_ts: datetime | None
    max_processed_ts: datetime | None
    replication_lag_seconds: float

    def metadata(self) -> dict:
        return {
            "replication_lag_seconds": round(self.replication_lag_seconds, 3),
            "staged_unprocessed_records": self.staged_unprocessed,
            "staged_records": self.staged_records,
            "max_staged_cdc_ts": _iso(self.max_staged_ts),
            "max_processed_cdc_ts": _iso(self.max_processed_ts),
        }


def _iso(ts: datetime | None) -> str:
    return ts.isoformat() if ts is not None else ""


def _column(actions: pa.Table, *names: str) -> pa.ChunkedArray:
    for name in names:
        if name in actions.column_names:
            return actions[name]
    raise KeyError(f"none of {names} in the Delta add actions ({actions.column_names})")


def _files(lake: DeltaLake, version: int | None = None) -> pa.Table:
    """Staging data files: path, tenant, rows, min/max cdc_ts (from the log, no data read)."""
    actions = pa.table(lake.table(PROFILE_CDC_STAGING.name, version=version).get_add_actions(flatten=True))
    return pa.table(
        {
            "path": _column(actions, "path"),
            "tenant": _column(actions, "partition.tenant", "partition_values.tenant"),
            "rows": _column(actions, "num_records"),
            "min_ts": pc.cast(_column(actions, "min.cdc_ts"), pa.timestamp("us", tz="UTC")),
            "max_ts": pc.cast(_column(actions, "max.cdc_ts"), pa.timestamp("us", tz="UTC")),
        }
    )


def _processed(lake: DeltaLake) -> dict[str, tuple[int, datetime | None]]:
    """tenant -> (staging version merged up to, newest CDC timestamp merged in any batch)."""
    if not lake.exists(PROFILE_PROGRESS.name):
        return {}
    rows = lake.read(PROFILE_PROGRESS.name, columns=["tenant", "batch_id", "staging_version", "max_cdc_ts"]).to_pylist()
    out: dict[str, tuple[int, datetime | None]] = {}
    for r in sorted(rows, key=lambda r: r["batch_id"]):
        known = [t for t in (out.get(r["tenant"], (-1, None))[1], r["max_cdc_ts"]) if t is not None]
        out[r["tenant"]] = (r["staging_version"], max(known) if known else None)
    return out


def tenant_lags(lake: DeltaLake, tenants: list[str] | None = None) -> dict[str, TenantLag]:
    """Replication lag and staged-but-unmerged records of each staged tenant (or of `tenants`)."""
    if not lake.exists(PROFILE_CDC_STAGING.name):
        return {}
    files = _files(lake).to_pylist()
    processed = _processed(lake)
    seen_at: dict[int, set[str]] = {}  # staging version -> its file paths, loaded once per version
    by_tenant: dict[str, list[dict]] = {}
    for f in files:
        by_tenant.setdefault(f["tenant"], []).append(f)
    out = {}
    for tenant in sorted(tenants if tenants is not None else by_tenant):
        mine = by_tenant.get(tenant, [])
        version, merged_ts = processed.get(tenant, (-1, None))
        if version >= 0 and version not in seen_at:
            seen_at[version] = set(_files(lake, version)["path"].to_pylist())
        old = seen_at.get(version, set())
        unprocessed = sum(f["rows"] for f in mine if f["path"] not in old)
        newest = max((f["max_ts"] for f in mine if f["max_ts"] is not None), default=None)
        oldest = min((f["min_ts"] for f in mine if f["min_ts"] is not None), default=None)
        floor = merged_ts if merged_ts is not None else oldest
        lag = max((newest - floor).total_seconds(), 0.0) if newest is not None and floor is not None else 0.0
        out[tenant] = TenantLag(tenant, sum(f["rows"] for f in mine), unprocessed, newest, merged_ts, lag)
    return out
