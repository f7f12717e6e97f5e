"""Incremental and batch reads for downstream consumers of a mutable table.

Delta's own streaming read needs an append-only table; these tables are rewritten by mutations and
deletions. So consumers follow the notification table instead (seed design): a consumer's checkpoint
is the notification table's version. Notification rows are appended in commit order, so a
checkpoint never skips one, even when two writers' data commits and notifications interleave.
The rows themselves come from the data table's change data feed at the notified versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.delta import DeltaLake, TableSpec, sql_literal

START = -1  # checkpoint of a consumer that has read nothing yet


@dataclass(frozen=True)
class ChangeSet:
    rows: pa.Table  # changed rows + _change_type (insert | update_postimage | delete) + _commit_version
    checkpoint: int  # give it back on the next call
    table_versions: list[int]


def changes_since(lake: DeltaLake, notifications: TableSpec, table: str, org_id: str, checkpoint: int = START) -> ChangeSet:
    if not lake.exists(notifications.name):
        return ChangeSet(pa.table({}), checkpoint, [])
    current = lake.table(notifications.name).version()
    if checkpoint >= current:
        return ChangeSet(pa.table({}), checkpoint, [])
    notes = lake.changes(notifications.name, checkpoint + 1, current, predicate=f"org_id = {sql_literal(org_id)}")
    notes = notes.filter(pc.and_(pc.equal(notes["table_name"], table), pc.equal(notes["_change_type"], "insert")))
    versions = sorted(set(notes["table_version"].to_pylist()))
    if not versions:
        return ChangeSet(pa.table({}), current, [])
    rows = lake.changes(table, versions[0], versions[-1], predicate=f"org_id = {sql_literal(org_id)}")
    keep = pc.and_(
        pc.is_in(rows["_commit_version"], pa.array(versions, rows["_commit_version"].type)),
        pc.not_equal(rows["_change_type"], "update_preimage"),
    )
    rows = rows.filter(keep).sort_by([("_commit_version", "ascending")])
    return ChangeSet(rows, current, versions)


def read_org_dates(lake: DeltaLake, table: str, org_id: str, start: date | None = None, end: date | None = None,
                   date_column: str = "engagement_date") -> pa.Table:
    """Batch read of one org's rows in an inclusive date range (partition pruning + data skipping)."""
    filters = [("org_id", "=", org_id)]
    if start:
        filters.append((date_column, ">=", start))
    if end:
        filters.append((date_column, "<=", end))
    return lake.read(table, filters=filters)
