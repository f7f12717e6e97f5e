"""Incremental and batch reads for downstream consumers of a mutable table.

Delta's own streaming read needs an append-only table; these tables are rewritten by mutations and
deletions. So consumers follow the notification table instead (seed design): a consumer's checkpoint
is the notification table's version. Notification rows are appended in commit order, so a
checkpoint never skips one, even when two writers' data commits and notifications interleave.
The rows themselves come, per notified version, from the table's change log when the version is logged
(lake/change_log.py: commits of file actions without change-data files), else from the table's change
data feed; the change feed is read only over runs of versions with no logged version inside.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from datetime import date

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import DeltaError

from engagement_platform.lake.change_log import (
    CHANGE_TYPE,
    COMMIT_VERSION,
    change_log_name,
    logged_changes,
    logged_versions,
)
from engagement_platform.lake.delta import DeltaLake, Filter, TableSpec, sql_literal

START = -1  # checkpoint of a consumer that has read nothing yet
COMMIT_TIMESTAMP = "_commit_timestamp"


@dataclass(frozen=True)
class ChangeSet:
    rows: (
        pa.Table
    )  # changed rows + _change_type (insert | update_postimage | delete) + _commit_version + _commit_timestamp
    checkpoint: int  # give it back on the next call
    table_versions: list[int]


def changes_since(
    lake: DeltaLake,
    notifications: TableSpec,
    table: str,
    org_id: str | None,
    checkpoint: int = START,
    preimages: bool = False,
) -> ChangeSet:
    """The changed rows of `table` notified after `checkpoint`: one org's, or every org's with `org_id` None.
    `preimages`: keep the update pre-images (a consumer that subtracts the old row, an aggregate, needs them)."""
    if not lake.exists(notifications.name):
        return ChangeSet(pa.table({}), checkpoint, [])
    current = lake.table(notifications.name).version()
    if checkpoint >= current:
        return ChangeSet(pa.table({}), checkpoint, [])
    notes = lake.changes(notifications.name, checkpoint + 1, current, predicate=org_predicate(org_id))
    notes = notes.filter(pc.and_(pc.equal(notes["table_name"], table), pc.equal(notes["_change_type"], "insert")))
    versions = sorted(set(notes["table_version"].to_pylist()))
    if not versions:
        return ChangeSet(pa.table({}), current, [])
    try:
        rows = changes_at(lake, table, versions, org_id, preimages)
    except (DeltaError, OSError) as exc:  # the versions' log entries or change-data files are gone
        raise ChangesExpired(
            f"{table}: the changes of versions {versions[0]}..{versions[-1]} (checkpoint {checkpoint}) are no longer kept: removed files "
            f"and log entries stay half of EP_ERASURE_WINDOW (docs/design/erasure.md). Re-read the org in full "
            f"(read_org_dates) and continue from checkpoint {current}. ({type(exc).__name__}: {str(exc)[:200]})"
        ) from exc
    return ChangeSet(rows, current, versions)


def org_predicate(org_id: str | None) -> str | None:
    return f"org_id = {sql_literal(org_id)}" if org_id is not None else None


class ChangesExpired(Exception):
    """A consumer fell further behind than the lake keeps changes: it must re-read in full."""


def changes_at(
    lake: DeltaLake, table: str, versions: list[int], org_id: str | None, preimages: bool = False
) -> pa.Table:
    """One org's (or, with None, every org's) changed rows of `table` at `versions` (sorted, at least one), in the
    change feed's columns (update pre-images left out unless asked for): logged versions from the change log,
    the others from the change data feed."""
    log = change_log_name(table)
    logged = logged_versions(lake, table, versions[0], versions[-1])
    pieces = [feed_rows(lake, table, run, org_id) for run in unlogged_runs(versions, logged)]
    in_log = set(logged)
    from_log = [v for v in versions if v in in_log]
    if from_log:
        pieces.append(
            as_feed_rows(
                lake, table, logged_changes(lake, log, from_log, org_id), lake.table(log).metadata().partition_columns
            )
        )
    rows = pa.concat_tables(
        pieces, promote_options="permissive"
    )  # columns matched by name, the change feed's order first
    if not preimages:
        rows = rows.filter(pc.not_equal(rows[CHANGE_TYPE], "update_preimage"))
    return rows.sort_by([(COMMIT_VERSION, "ascending")])


def unlogged_runs(versions: list[int], logged: list[int]) -> list[list[int]]:
    """The versions not in `logged` (sorted), split wherever a logged version lies between two of them:
    each run is one change-feed read that never covers a logged commit's file-level changes."""
    runs: list[list[int]] = []
    skip = set(logged)
    for v in versions:
        if v in skip:
            continue
        if runs and bisect_right(logged, runs[-1][-1]) == bisect_right(logged, v):
            runs[-1].append(v)
        else:
            runs.append([v])
    return runs


def feed_rows(lake: DeltaLake, table: str, versions: list[int], org_id: str | None) -> pa.Table:
    """One org's (None: every org's) change data feed rows at exactly these versions (read over their range)."""
    # delta-rs reads a change feed whose older commits log cleanup removed as if they had no changes: a
    # version the table cannot be loaded at any more is an error here, never silently empty
    lake.table(table, versions[0])
    rows = lake.changes(table, versions[0], versions[-1], predicate=org_predicate(org_id))
    return rows.filter(pc.is_in(rows[COMMIT_VERSION], pa.array(versions, rows[COMMIT_VERSION].type)))


def as_feed_rows(lake: DeltaLake, table: str, logged: pa.Table, partition_by: list[str]) -> pa.Table:
    """Change-log rows in the change feed's layout: data columns with the partition columns last, then
    _change_type, _commit_version (uint64) and _commit_timestamp, the data commit's timestamp from the
    table's history (null once log cleanup removed that commit's entry)."""
    meta = (CHANGE_TYPE, COMMIT_VERSION)
    data = [c for c in logged.column_names if c not in partition_by and c not in meta] + [
        c for c in partition_by if c in logged.column_names
    ]
    versions = logged[COMMIT_VERSION].to_pylist()
    stamps = commit_timestamps(lake, table, sorted(set(versions)))
    return pa.table(
        [
            *(logged[c] for c in data),
            logged[CHANGE_TYPE].cast(pa.string()),
            logged[COMMIT_VERSION].cast(pa.uint64()),
            pa.array([stamps.get(v) for v in versions], pa.timestamp("ms")),
        ],
        names=[*data, CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP],
    )


def commit_timestamps(lake: DeltaLake, table: str, versions: list[int]) -> dict[int, int]:
    """version -> commit timestamp (ms since the epoch) from the table's history, read back to the oldest one."""
    if not versions:
        return {}
    wanted = set(versions)
    history = lake.history(table, since=min(versions))
    return {int(h["version"]): int(h["timestamp"]) for h in history if h.get("version") in wanted}


def read_org_dates(
    lake: DeltaLake,
    table: str,
    org_id: str,
    start: date | None = None,
    end: date | None = None,
    date_column: str = "engagement_date",
) -> pa.Table:
    """Batch read of one org's rows in an inclusive date range (partition pruning + data skipping)."""
    filters: list[Filter] = [("org_id", "=", org_id)]
    if start:
        filters.append((date_column, ">=", start))
    if end:
        filters.append((date_column, "<=", end))
    return lake.read(table, filters=filters)
