"""Integrity measurements of the profile lake (no Dagster): the numbers its asset checks report."""

from __future__ import annotations

import pyarrow.compute as pc

from engagement_platform.lake.delta import DeltaLake
from engagement_platform.profiles.tables import raw_table_name


def duplicate_primary_ids(lake: DeltaLake, tenant: str) -> tuple[int, int]:
    """(rows beyond one per primary id, rows) in the tenant's raw table."""
    name = raw_table_name(tenant)
    if not lake.exists(name):
        return 0, 0
    ids = lake.read(name, columns=["primary_id"])["primary_id"]
    return len(ids) - pc.count_distinct(ids).as_py(), len(ids)
