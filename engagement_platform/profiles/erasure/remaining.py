"""What is left of erased identities in the profile lake, found by the suppression list's hashes alone
(no id is kept to look for): what the erasure check measures and the tests assert (no Dagster)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from engagement_platform.lake.delta import DeltaLake, text_column
from engagement_platform.lake.suppression import Suppressed
from engagement_platform.profiles.erasure.identity import naming_rows
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, QUARANTINE_PROFILE_CDC, raw_table_name


def suppressed_mask(rows: pa.Table, tenant: str, suppressed: Suppressed) -> pa.Array:
    """Which rows have a primary id or a related / linked id that hashes to a suppressed subject of `tenant`
    (each distinct id hashed once, then the rows naming them: identity.naming_rows)."""
    if rows.num_rows == 0:
        return pa.array([], pa.bool_())
    rows = plain_strings(rows)
    ids = set(pc.unique(rows["primary_id"]).to_pylist())
    for c in ("related_ids", "linked_ids"):
        if c in rows.column_names:
            ids |= set(pc.unique(pc.list_flatten(rows[c])).to_pylist())
    return naming_rows(rows, {i for i in ids if i is not None and suppressed.hit(tenant, [i])})


def _rows_with_suppressed_ids(rows: pa.Table, tenant: str, suppressed: Suppressed) -> int:
    return pc.sum(suppressed_mask(rows, tenant, suppressed)).as_py() or 0 if rows.num_rows else 0


def plain_strings(rows: pa.Table) -> pa.Table:
    """Files a delta-rs MERGE wrote hold string_view (and lists of it); compute kernels want plain strings."""

    def plain(t: pa.DataType) -> pa.DataType:
        if pa.types.is_string_view(t):
            return pa.string()
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return pa.list_(plain(t.value_type))
        return t

    return rows.cast(pa.schema([pa.field(f.name, plain(f.type)) for f in rows.schema]))


def profile_rows_naming(lake: DeltaLake, suppressed: Suppressed, tenants: list[str] | None = None) -> dict[str, int]:
    """Rows naming a suppressed id of their tenant, per table: each tenant's raw table, staging, the CDC quarantine."""
    counts = {PROFILE_CDC_STAGING.name: 0, QUARANTINE_PROFILE_CDC.name: 0}
    scopes = [t for t in (tenants if tenants is not None else suppressed.scopes) if t in suppressed.by_scope]
    for tenant in scopes:
        raw = raw_table_name(tenant)
        if lake.exists(raw):
            rows = lake.table(raw).to_pyarrow_dataset().to_table(columns=["primary_id", "related_ids", "linked_ids"])
            counts[raw] = _rows_with_suppressed_ids(rows, tenant, suppressed)
        if lake.exists(PROFILE_CDC_STAGING.name):
            rows = (
                lake.table(PROFILE_CDC_STAGING.name)
                .to_pyarrow_dataset()
                .to_table(columns=["primary_id", "related_ids"], filter=ds.field("tenant") == tenant)
            )
            counts[PROFILE_CDC_STAGING.name] += _rows_with_suppressed_ids(rows, tenant, suppressed)
    if scopes and lake.exists(QUARANTINE_PROFILE_CDC.name):
        rows = (
            lake.table(QUARANTINE_PROFILE_CDC.name)
            .to_pyarrow_dataset()
            .to_table(
                columns=["org_id", "raw", "input"],
                filter=text_column("org_id").isin(scopes) | ds.field("org_id").is_null(),
            )
        )
        counts[QUARANTINE_PROFILE_CDC.name] = sum(
            1 for r in rows.to_pylist() if suppressed.content_hit(r["org_id"], [r["raw"], r["input"]])
        )
    return counts
