"""The profile lake's daily upkeep (no Dagster): a purge of raced rows naming erased ids, staging
retention, then the erasure window's passes.

Staging retention: staging is a mailbox, not an archive of personal data. A staged file goes when every
row in it is merged (the file is in the staging snapshot the tenant's processor has merged up to) and its
15-minute bucket ended more than EP_PROFILE_STAGING_RETENTION ago: one commit of removes (no predicate,
no rewrite: whole files), then the vacuum deletes them once older than half the erasure window.

The window (EP_ERASURE_WINDOW, docs/design/erasure.md): full vacuum of staging, the quarantines and every
tenant's raw table past half the window, their logs checkpointed and cleaned past it, and the handoff
folders a crashed run left swept.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.file_writes import commit_files, filesystem
from engagement_platform.lake.row_erasure import erase_rows, expire_logs, live_files, purge_quarantine, vacuum_tables
from engagement_platform.lake.suppression_tables import load_suppressed
from engagement_platform.profiles.erasure.remaining import suppressed_mask
from engagement_platform.profiles.locks import tenant_locks
from engagement_platform.profiles.processor.progress import latest_progress, staged_tenants
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS
from engagement_platform.profiles.snapshots import files_by_tenant
from engagement_platform.profiles.tables import (
    PROFILE_CDC_STAGING,
    PROFILE_ERASED_SUBJECTS,
    PROFILE_ERASURE_AUDIT,
    QUARANTINE_PROFILE_CDC,
    QUARANTINE_PROFILE_ERASURE,
    bucket_end,
    raw_table_name,
)
from engagement_platform.settings import ErasureSettings
from engagement_platform.spark.handoff_files import sweep_all_handoffs
from engagement_platform.streams.coordinator import Coordinator

RETENTION_APP_ID = "profile.staging_retention"
PURGE_APP_ID = "profile.upkeep.purge"


def expired_staging_files(lake: DeltaLake, tenant: str, merged_version: int, cutoff: datetime) -> list:
    """The tenant's staging files that are merged (present in snapshot `merged_version`) and whose bucket
    ended before `cutoff`."""
    if merged_version < 0:
        return []
    merged = {
        uri.rsplit("/", 1)[-1]
        for uri in files_by_tenant(lake, PROFILE_CDC_STAGING.name, merged_version).get(tenant, set())
    }
    return [
        f
        for f in live_files(lake, PROFILE_CDC_STAGING, {"tenant": tenant})
        if f.path.rsplit("/", 1)[-1] in merged and bucket_end(f.partition_values["bucket"]) < cutoff
    ]


def expire_staging(lake: DeltaLake, retention_seconds: float, now: datetime | None = None) -> dict[str, int]:
    """Remove every tenant's merged staging files older than the retention, in one commit: files per tenant."""
    if not lake.exists(PROFILE_CDC_STAGING.name):
        return {}
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=retention_seconds)
    progress = latest_progress(lake)
    expired = {
        t: expired_staging_files(lake, t, progress[t]["staging_version"], cutoff)
        for t in sorted(staged_tenants(lake))
        if t in progress
    }
    removes = [f for files in expired.values() for f in files]
    if removes:
        # an upkeep run is its own writer: the txn version only has to grow (a retried run lists anew)
        commit_files(
            lake,
            PROFILE_CDC_STAGING,
            [],
            BatchTxn(RETENTION_APP_ID, int(time.time() * 1000)),
            removes,
            {"rewrite": "staging_retention", "cutoff": cutoff.isoformat()},
        )
    return {t: len(files) for t, files in expired.items() if files}


def raw_tenants(lake: DeltaLake) -> list[str]:
    """Tenants with a raw table, from a listing of `<lake>/profile_raw/` (a backfilled tenant may have no
    staging and no progress, and retention may have emptied a tenant's staging)."""
    fs, root = filesystem(lake.uri(raw_table_name("x").rsplit("/", 1)[0]), lake.storage_options)
    infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    return sorted(
        i.base_name for i in infos if i.type == pafs.FileType.Directory and lake.exists(raw_table_name(i.base_name))
    )


def window_tables(lake: DeltaLake) -> list[str]:
    """The profile tables that can hold a person: staging, the quarantines, the erasure audit, segment membership,
    every raw table."""
    raw = [raw_table_name(t) for t in raw_tenants(lake)]
    return [
        PROFILE_CDC_STAGING.name,
        QUARANTINE_PROFILE_CDC.name,
        QUARANTINE_PROFILE_ERASURE.name,
        PROFILE_ERASURE_AUDIT.name,
        PROFILE_SEGMENTS.name,
        PROFILE_SEGMENT_CHANGES.name,
        *raw,
    ]


def purge_suppressed(lake: DeltaLake, secret: bytes, coordinator: Coordinator | None = None) -> dict[str, int]:
    """Rows naming an erased id that no erasure batch could remove: changes a dumper batch staged while racing
    an erasure (checked before it, committed after), segment entries and exits of an evaluation that read the
    raw rows before the erasure and committed after it (evaluations take no tenant lock), and quarantined
    records or requests naming an id a later request erased. Staging and the two membership tables are
    rewritten without them (the membership tables under the tenants' locks, as a compaction rewrites the base
    under them); the quarantines lose them by key. Rows per table."""
    suppressed = load_suppressed(lake, PROFILE_ERASED_SUBJECTS, secret)
    if not suppressed:
        return {}

    def remove(rows: pa.Table) -> pa.Array:
        mask = pa.array([False] * rows.num_rows, pa.bool_())
        for tenant in suppressed.scopes:
            mask = pc.or_(mask, pc.and_(pc.equal(rows["tenant"], tenant), suppressed_mask(rows, tenant, suppressed)))
        return mask

    def remove_members(rows: pa.Table) -> pa.Array:  # a membership row names a person by one of its ids
        mask = pa.array([False] * rows.num_rows, pa.bool_())
        for tenant in suppressed.scopes:
            ids = pc.unique(rows["identity"].filter(pc.equal(rows["tenant"], tenant))).to_pylist()
            erased = [i for i in ids if i is not None and suppressed.hit(tenant, [i])]
            if erased:
                hit = pc.is_in(rows["identity"], value_set=pa.array(erased, pa.string()))
                mask = pc.or_(mask, pc.and_(pc.equal(rows["tenant"], tenant), hit))
        return mask

    txn = BatchTxn(PURGE_APP_ID, int(time.time() * 1000))
    files = [f for t in suppressed.scopes for f in live_files(lake, PROFILE_CDC_STAGING, {"tenant": t})]
    _, staged = erase_rows(lake, PROFILE_CDC_STAGING, files, remove, txn)
    with tenant_locks(coordinator, sorted(suppressed.scopes), PURGE_APP_ID):
        members = {
            spec.name: erase_rows(
                lake,
                spec,
                [f for t in suppressed.scopes for f in live_files(lake, spec, {"tenant": t})],
                remove_members,
                txn,
            )[1]
            for spec in (PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS)
        }
    return {
        PROFILE_CDC_STAGING.name: staged,
        **members,
        **{
            spec.name: purge_quarantine(lake, spec, suppressed, PURGE_APP_ID)
            for spec in (QUARANTINE_PROFILE_CDC, QUARANTINE_PROFILE_ERASURE)
        },
    }


def profile_upkeep(
    lake: DeltaLake,
    erasure: ErasureSettings,
    staging_retention_seconds: float,
    vacuum_hours: int,
    coordinator: Coordinator | None = None,
) -> dict:
    """Purge of raced rows, staging retention, then vacuum, log expiry and handoff sweep over window_tables."""
    started = time.perf_counter()
    purged = purge_suppressed(lake, erasure.secret, coordinator)
    expired = expire_staging(lake, staging_retention_seconds)
    tables = window_tables(lake)
    vacuumed = vacuum_tables(lake, tables, vacuum_hours)
    logs = expire_logs(lake, tables, erasure.retention_seconds)
    swept = sweep_all_handoffs(lake.root, erasure.handoff_age, lake.storage_options)
    return {
        "rows_purged": sum(purged.values()),
        **{f"rows_purged_{t}": n for t, n in purged.items()},
        "staging_files_expired": sum(expired.values()),
        "tenants_with_expired_staging": len(expired),
        "tables": len(tables),
        "files_vacuumed": sum(n for n in vacuumed.values() if n > 0),
        "logs_expired": sum(v >= 0 for v in logs.values()),
        "log_expiry_conflicts": sum(v < 0 for v in logs.values()),
        "handoff_folders_swept": len(swept),
        "erasure_window_seconds": erasure.window_seconds,
        "seconds": round(time.perf_counter() - started, 3),
    }
