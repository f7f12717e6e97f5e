"""engagement_activity's commit in a mutation batch: the files the executors wrote and the files they
replace, in ONE commit with the batch's txn (lake/file_writes.commit_files).

The tasks computed against the batch's pinned table version. A first attempt commits right after (it
holds the table's lock), so every file it replaces is still live. A re-run after a crash may find that
another writer (retention, upkeep) committed in between and removed a file this batch would replace;
its rows then cannot be trusted, so the batch falls back to a delta-rs MERGE of the changed rows by
key against the current table (what this stream did before executors wrote files), and deletes the
files its tasks wrote. A MERGE writes change-data files, so its commit needs no change-log rows.

The change log's step (log_step) commits the log files the tasks wrote for a file commit, and nothing
for a MERGE (Delta's change data feed is exact there; the files stay uncommitted and are deleted).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.mutation.on_executors import ExecutorResult
from engagement_platform.engagement.mutation.org_outcome import CHANGE_TYPE
from engagement_platform.engagement.mutation.outcome_table import ACTION, DELETE, UPDATE
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_ACTIVITY_CHANGES
from engagement_platform.lake.change_log import COMMIT_VERSION, LOGGED_BY, change_log_files_step
from engagement_platform.lake.delta import BatchTxn, DeltaLake, sql_literal
from engagement_platform.lake.file_writes import commit_files, delete_uncommitted, read_file
from engagement_platform.lake.notifications import change_counts
from engagement_platform.streams.batch import CommitStep, Outcomes

MERGE = "MERGE"  # the commitInfo operation of a delta-rs MERGE


@dataclass
class Applied:
    """What the batch's commit of engagement_activity did, filled in by its step."""

    how: str = "none"  # files | merge | none (nothing to change) | earlier (an earlier attempt committed)
    metrics: dict = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(
        default_factory=dict
    )  # org -> inserted/updated/deleted of this attempt's commit


def files_still_live(lake: DeltaLake, result: ExecutorResult, pinned: int) -> bool:
    """Does the current table still reference every file the batch replaces (as at the pinned version)?"""
    table = lake.table(ENGAGEMENT_ACTIVITY.name)
    if table.version() == pinned:
        return True
    live = set(pa.table(table.get_add_actions(flatten=False))["path"].to_pylist())
    return all(f.path in live for f in result.removes)


def files_to_write(lake: DeltaLake, app_id: str, batch: int, tag: str) -> tuple[bool, int | None]:
    """(write the data files?, the version to stamp the change log's files with, None: write none) for this
    attempt of the batch; files an earlier attempt wrote but never committed are deleted first.

    First attempt: both, the log stamped with the version the data commit will get (the table's next one:
    the batch holds the table's lock; log_step restamps if another writer committed in between). A re-run
    whose data commit is there writes no data files, and log files only if the log's commit is missing and
    the data commit was not a MERGE (then stamped with its version)."""
    lake.ensure(ENGAGEMENT_ACTIVITY)
    lake.ensure(ENGAGEMENT_ACTIVITY_CHANGES)  # the tables exist before any file is written into their folders
    txn = BatchTxn(app_id, batch)
    log_missing = not lake.already_committed(ENGAGEMENT_ACTIVITY_CHANGES.name, txn)
    if lake.already_committed(ENGAGEMENT_ACTIVITY.name, txn):
        info = lake.batch_commit(ENGAGEMENT_ACTIVITY.name, app_id, batch) or {}
        stamp = int(info["version"]) if log_missing and info and info.get("operation") != MERGE else None
        # Whatever an attempt wrote and no commit references (the committed files are referenced): a crash
        # between a MERGE fallback and its clean-up, or log files of an attempt that died before the log commit.
        delete_uncommitted(lake, ENGAGEMENT_ACTIVITY, tag)
        delete_uncommitted(lake, ENGAGEMENT_ACTIVITY_CHANGES, tag)
        return False, stamp
    delete_uncommitted(lake, ENGAGEMENT_ACTIVITY, tag)
    delete_uncommitted(lake, ENGAGEMENT_ACTIVITY_CHANGES, tag)
    return True, lake.table(ENGAGEMENT_ACTIVITY.name).version() + 1 if log_missing else None


def committed_by_merge(lake: DeltaLake, app_id: str, batch: int) -> bool:
    """Was the batch's commit of engagement_activity a MERGE (the fallback, or a batch of an older version)?"""
    info = lake.batch_commit(ENGAGEMENT_ACTIVITY.name, app_id, batch) or {}
    return info.get("operation") == MERGE


def log_step(lake: DeltaLake, app_id: str, batch: int, result: ExecutorResult, stamped: int | None) -> CommitStep:
    """The change log's commit: the tasks' log files (stamped with the version they expected the data
    commit to get), none when the data commit was a MERGE."""
    return change_log_files_step(
        lake,
        ENGAGEMENT_ACTIVITY_CHANGES,
        ENGAGEMENT_ACTIVITY.name,
        app_id,
        batch,
        result.log_adds,
        -1 if stamped is None else stamped,
        skip=lambda: committed_by_merge(lake, app_id, batch),
    )


def merge_source(changes: pa.Table) -> pa.Table:
    """The MERGE source equal to `changes`: post-images to update, deleted rows to delete."""
    kinds = changes[CHANGE_TYPE]
    post = changes.filter(pc.equal(kinds, "update_postimage")).drop_columns([CHANGE_TYPE])
    gone = changes.filter(pc.equal(kinds, "delete")).drop_columns([CHANGE_TYPE])
    return pa.concat_tables(
        [
            post.append_column(ACTION, pa.array([UPDATE] * post.num_rows, pa.string())),
            gone.append_column(ACTION, pa.array([DELETE] * gone.num_rows, pa.string())),
        ]
    )


def activity_step(
    lake: DeltaLake,
    app_id: str,
    batch: int,
    tag: str,
    result: ExecutorResult,
    pinned: int,
    applied: Applied,
    seconds: dict[str, float],
) -> CommitStep:
    name = ENGAGEMENT_ACTIVITY.name

    def commit(txn: BatchTxn, _: Outcomes) -> int | None:
        lake.ensure(ENGAGEMENT_ACTIVITY)
        if lake.already_committed(name, txn):
            info = lake.batch_commit(name, app_id, batch) or {}
            applied.metrics.update(info.get("operationMetrics") or {})
            applied.how = "earlier"
            return None
        if not result.removes and not result.adds:
            return None  # nothing to change: no commit (a re-run finds nothing to do either)
        t = time.perf_counter()
        if files_still_live(lake, result, pinned):
            version = commit_files(
                lake,
                ENGAGEMENT_ACTIVITY,
                result.adds,
                txn,
                result.removes,
                {LOGGED_BY: ENGAGEMENT_ACTIVITY_CHANGES.name},
            )
            applied.how = "files"
            applied.counts.update(result.change_counts())
            applied.metrics.update(files_added=len(result.adds), files_removed=len(result.removes))
        else:
            log_uri = lake.uri(ENGAGEMENT_ACTIVITY_CHANGES.name)
            changes = pa.concat_tables(
                [read_file(log_uri, ENGAGEMENT_ACTIVITY_CHANGES, f, lake.storage_options) for f in result.log_adds]
                or [ENGAGEMENT_ACTIVITY_CHANGES.schema.empty_table()]
            )
            source = merge_source(changes.drop_columns([COMMIT_VERSION]))
            orgs = ", ".join(sql_literal(o) for o in pc.unique(source["org_id"]).to_pylist())
            applied.metrics.update(
                lake.merge(
                    ENGAGEMENT_ACTIVITY,
                    source,
                    f"t.org_id IN ({orgs}) AND t.org_id = s.org_id AND t.engagement_id = s.engagement_id",
                    txn,
                )
                .when_matched_update_all(predicate=f"s.{ACTION} = '{UPDATE}'", except_cols=[ACTION])
                .when_matched_delete(predicate=f"s.{ACTION} = '{DELETE}'")
                .execute()
            )
            applied.how = "merge"
            version = lake.find_batch_commit(name, app_id, batch)  # its own version, whatever committed after it
            applied.counts.update(change_counts(lake, name, version))
            delete_uncommitted(lake, ENGAGEMENT_ACTIVITY, tag)  # the tasks' files: no commit references them
            delete_uncommitted(lake, ENGAGEMENT_ACTIVITY_CHANGES, tag)
        seconds["commit_activity"] = time.perf_counter() - t
        return version

    return CommitStep(name, commit)
