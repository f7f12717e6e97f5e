"""The row-level change log of a data table whose writers commit file actions without change-data files.

Why it exists: a writer that rewrites a table's Parquet files itself (Spark tasks, lake/file_writes.py)
commits the adds and removes through delta-rs's `create_write_transaction`, which cannot write CDC files.
Delta's change data feed of such a commit is file-level, not row-level: every row of every removed file
reads as deleted and every row of every added file as inserted. So that writer also commits, in the same
batch, the commit's exact row-level changes to the table's change log, `<table>_changes`
(change_log_spec): the data table's columns + `_change_type` (Delta's change-feed names: insert,
update_preimage, update_postimage, delete) + `_commit_version` (the data table's version the change
belongs to). The log is partitioned like the data table, has statistics on `_commit_version` (a read by
version skips the other files) and no change data feed of its own.

The rule every reader follows (lake/changes.py `changes_since`, lake/notifications.py `change_counts`):

- a data-table version is *logged* iff its commit says so: the writer puts LOGGED_BY (the log's name)
  in the commit's metadata (file_writes.commit_files' `metadata`), read back from the table's history;
  for a logged version the log is the truth, and the change data feed is not read for it (a version
  whose rows an erasure later removed from the log stays logged: it reads as no rows, never as the
  commit's file-level feed);
- a writer that commits file actions without CDC files logs at least one row per commit (a commit that
  changes nothing is not made), in the same batch as the commit and before its notification rows;
- for the versions that are not logged, Delta's own change data feed is exact: appends (every add is an
  insert) and delta-rs DELETE and MERGE (they write CDC files).

Exactly once: the log's commit step (change_log_step) carries the batch's txn like every step, and finds
the data commit's version by its txn when a re-run did not make it (the crash came in between).

Erasure: the log holds personal data, so the retention stream redacts the rows its cut-offs and erasures match
(the ids and free text set to null, engagement/retention/erasure.py REDACTED_IN_LOG) and the daily full vacuum
removes the files that held them. Not deleted: a reader that had not read a logged change yet must still see it.
Readers that lag beyond the data table's log retention get an error, as for the change data feed.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.delta import BatchTxn, DeltaLake, Filter, TableSpec
from engagement_platform.lake.file_writes import (
    DEFAULT_STATS_COLUMNS,
    WrittenFile,
    commit_files,
    transform_files,
    writer_tag,
)
from engagement_platform.streams.batch import CommitStep, Outcomes

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
CHANGE_TYPES = ("insert", "update_preimage", "update_postimage", "delete")
LOG_SUFFIX = "_changes"
LOGGED_BY = "change_log"  # the data commit's metadata key naming the log that holds its row-level changes


def change_log_name(table: str) -> str:
    """The change log's name for a data table: how readers find it from the table's name alone."""
    return f"{table}{LOG_SUFFIX}"


def change_log_spec(data: TableSpec, name: str | None = None) -> TableSpec:
    """The change log of `data`: its columns + _change_type + _commit_version, partitioned the same way."""
    data_stats = (
        data.stats_columns
        or tuple(c for c in data.schema.names if c not in data.partition_by)[: DEFAULT_STATS_COLUMNS - 1]
    )
    return TableSpec(
        name=name or change_log_name(data.name),
        schema=data.schema.append(pa.field(CHANGE_TYPE, pa.string())).append(pa.field(COMMIT_VERSION, pa.int64())),
        partition_by=data.partition_by,
        change_data_feed=False,  # the log is read by version, never through a change feed of its own
        stats_columns=(*data_stats, COMMIT_VERSION),
        target_file_size=data.target_file_size,
        description=f"Row-level changes of the {data.name} commits that carry no change-data files.",
    )


def data_commit_version(lake: DeltaLake, table: str, app_id: str, batch_id: int, done: Outcomes) -> int | None:
    """The version of the batch's commit of `table`: what this attempt committed, else the commit an earlier
    attempt made (found by its txn); None when there is none."""
    version = done.get(table)
    return lake.find_batch_commit(table, app_id, batch_id) if version is None else version


def stamped(rows: pa.Table, version: int) -> pa.Table:
    """`rows` with `_commit_version` = `version` (replaced if present)."""
    rows = rows.drop_columns([COMMIT_VERSION]) if COMMIT_VERSION in rows.column_names else rows
    return rows.append_column(COMMIT_VERSION, pa.repeat(pa.scalar(version, pa.int64()), rows.num_rows))


def change_log_step(
    lake: DeltaLake, log: TableSpec, table: str, app_id: str, batch_id: int, rows: pa.Table
) -> CommitStep:
    """Commit step of `log` for the batch's commit of `table` (an earlier step of the same batch).

    `rows` are the commit's changes (the data table's columns + _change_type); they get `_commit_version`
    = the version that step committed, or, when this attempt did not commit it (a re-run after a crash),
    the version found by the batch's txn. With no data commit at all the step commits no rows, only its
    txn (like the notification step). A re-run whose txn the log already holds writes nothing."""
    unknown = set(pc.unique(rows[CHANGE_TYPE]).to_pylist()) - set(CHANGE_TYPES) if rows.num_rows else set()
    if unknown:
        raise ValueError(f"change log rows of {table} with unknown {CHANGE_TYPE}: {sorted(map(str, unknown))}")

    def commit(txn: BatchTxn, done: Outcomes) -> int | None:
        version = data_commit_version(lake, table, app_id, batch_id, done)
        return lake.append(log, log.schema.empty_table() if version is None else stamped(rows, version), txn)

    return CommitStep(log.name, commit)


def change_log_files_step(
    lake: DeltaLake,
    log: TableSpec,
    table: str,
    app_id: str,
    batch_id: int,
    files: list[WrittenFile],
    expected: int,
    skip: Callable[[], bool] = lambda: False,
) -> CommitStep:
    """Commit step of `log` for log files writers already wrote into its folder (lake/file_writes.py), their
    rows stamped with `_commit_version` = `expected`, the version the writers expected the data commit to get.

    The data commit's actual version is found as in change_log_step. When it differs from `expected`
    (another writer committed in between), the files are rewritten with the right version first. With no
    data commit, or when `skip()` says the data commit needs no log (a MERGE, whose change feed is exact),
    the step commits no rows, only its txn, and the files stay uncommitted (delete_uncommitted)."""

    def commit(txn: BatchTxn, done: Outcomes) -> int | None:
        if lake.exists(log.name) and lake.already_committed(log.name, txn):
            return None
        version = data_commit_version(lake, table, app_id, batch_id, done)
        if version is None or skip():
            return lake.append(log, log.schema.empty_table(), txn)
        adds = files
        if version != expected:
            adds = transform_files(
                lake.uri(log.name),
                log,
                files,
                lambda rows: stamped(rows, version),
                writer_tag(app_id, batch_id),
                lake.storage_options,
            )
        return commit_files(lake, log, adds, txn)

    return CommitStep(log.name, commit)


def logged_versions(lake: DeltaLake, table: str, first: int, last: int) -> list[int]:
    """The versions in [first, last] of the data table `table` whose commit says its changes are in the log
    (LOGGED_BY in the commit's metadata, read from the table's history)."""
    if not lake.exists(table):
        return []
    history = lake.history(table, since=first)
    return sorted(int(h["version"]) for h in history if first <= int(h["version"]) <= last and h.get(LOGGED_BY))


def logged_changes(lake: DeltaLake, log_name: str, versions: list[int], org_id: str | None = None) -> pa.Table:
    """The log's rows of those data-table versions (one org's partition, or every org); an empty table
    without columns when the log does not exist."""
    if not lake.exists(log_name):
        return pa.table({})
    if not versions:
        return lake.table(log_name).to_pyarrow_dataset().schema.empty_table()
    filters: list[Filter] = [("org_id", "=", org_id)] if org_id is not None else []
    # The range lets the read skip files by their _commit_version statistics; `in` keeps only the versions asked.
    filters += [
        (COMMIT_VERSION, ">=", min(versions)),
        (COMMIT_VERSION, "<=", max(versions)),
        (COMMIT_VERSION, "in", sorted(set(versions))),
    ]
    return lake.read(log_name, filters=filters)
