"""The mutation batch's Spark task: for the orgs it holds, read the planned files of engagement_activity
once, compute what the requests do (org_outcome.orgs_outcome: hold-back, exact fold, row outcomes),
write each touched file anew into the table's folder, and write the row-level changes into the change log's folder
(pre/post-images and deletes: the file actions carry no change-data files), and hand back file actions,
held-back requests and counts. Table rows never travel to the driver, which commits the actions.

A task works through its orgs a chunk at a time (about CHUNK_FILES files each), so its memory is
bounded by a chunk, not by the table.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.mutation.org_outcome import (
    CHANGE_TYPE,
    FILE,
    ROW,
    change_rows,
    orgs_outcome,
    rewritten_file,
)
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_ACTIVITY_CHANGES
from engagement_platform.lake.change_log import stamped
from engagement_platform.lake.file_writes import WrittenFile, read_file, write_files
from engagement_platform.spark.handoff import handoff
from engagement_platform.spark.handoff_files import read_handoff

HELD, STATS, ADDS, REMOVES, LOG_ADDS, COUNTS = "held", "stats", "adds", "removes", "log_adds", "counts"  # handoff kinds
CHUNK_FILES = 256  # files read (whole) at a time by a task
STAT_NAMES = (
    "applied",
    "actions",
    "rows_scanned",
    "files_read",
    "updated",
    "replaced",
    "deleted",
    "unchanged",
    "task_read_ms",
    "task_compute_ms",
    "task_write_ms",
    "task_changes_ms",
)  # *_ms: summed over tasks
ROWS_SCHEMA = ENGAGEMENT_ACTIVITY.schema.append(pa.field(FILE, pa.int64())).append(pa.field(ROW, pa.int64()))


def org_chunks(
    orgs: list[str], files_by_org: Mapping[str, list[WrittenFile]], limit: int = CHUNK_FILES
) -> list[list[str]]:
    """Orgs in groups of about `limit` planned files (an org is never split: the rules are per org)."""
    chunks: list[list[str]] = [[]]
    size = 0
    for org in orgs:
        n = len(files_by_org.get(org, ()))
        if chunks[-1] and size + n > limit:
            chunks.append([])
            size = 0
        chunks[-1].append(org)
        size += n
    return [c for c in chunks if c]


def read_planned(table_uri: str, files: list[WrittenFile], storage_options: Mapping[str, str] | None) -> list[pa.Table]:
    """Each file's rows (table columns + FILE, ROW), read whole, once."""
    tables = []
    for index, written in enumerate(files):
        rows = read_file(table_uri, ENGAGEMENT_ACTIVITY, written, storage_options)
        tables.append(
            rows.append_column(FILE, pa.array(np.full(rows.num_rows, index, dtype=np.int64))).append_column(
                ROW, pa.array(np.arange(rows.num_rows, dtype=np.int64))
            )
        )
    return tables


def rewrite_touched(
    table_uri: str,
    files: list[WrittenFile],
    tables: list[pa.Table],
    source: pa.Table,
    tag: str,
    storage_options: Mapping[str, str] | None,
) -> tuple[list[WrittenFile], list[WrittenFile]]:
    """(added, removed): each file holding a changed row written anew (none when every row went) and removed."""
    adds: list[WrittenFile] = []
    removes: list[WrittenFile] = []
    if source.num_rows == 0:
        return adds, removes
    source = source.sort_by(FILE)
    at = source[FILE].to_numpy()
    bounds = np.flatnonzero(np.diff(at)) + 1
    for start, end in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(at)]])):
        index = int(at[start])
        changed = source.slice(int(start), int(end - start))
        adds += write_files(
            table_uri,
            ENGAGEMENT_ACTIVITY,
            rewritten_file(tables[index], changed, ENGAGEMENT_ACTIVITY.schema),
            tag,
            storage_options,
        )
        removes.append(files[index])
    return adds, removes


def org_counts(changes: pa.Table) -> pa.Table:
    """Per org: rows updated (post-images) and deleted, what the notification rows say."""
    kinds = changes[CHANGE_TYPE]
    flags = pa.table(
        {
            "org_id": changes["org_id"],
            "updated": pc.cast(pc.equal(kinds, "update_postimage"), pa.int64()),
            "deleted": pc.cast(pc.equal(kinds, "delete"), pa.int64()),
        }
    )
    return (
        flags.group_by("org_id")
        .aggregate([("updated", "sum"), ("deleted", "sum")])
        .rename_columns(["org_id", "updated", "deleted"])
    )


def rewrite_task(
    table_uri: str,
    log_uri: str,
    tag: str,
    write: bool,
    log_version: int | None,
    requests_folder: str,
    storage_options: Mapping[str, str] | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function over task indices (spark.range): task i reads its requests (whole orgs) from
    `requests_folder`/requests-<i>.arrow and their planned files from files-<i>.arrow (on_executors.py)
    and processes them. It writes the touched files
    anew when `write` (False: a re-run whose data commit is already there), and the row-level changes
    into the change log's folder, stamped with `log_version`, unless that is None (the log has them)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column("id").to_pylist():
                files_by_org: dict[str, list[WrittenFile]] = {}
                for text in read_handoff(f"{requests_folder}/files-{index}.arrow", storage_options)["file"].to_pylist():
                    written = WrittenFile.from_json(text)
                    files_by_org.setdefault(written.partition_values["org_id"], []).append(written)
                yield from run_one(
                    read_handoff(f"{requests_folder}/requests-{index}.arrow", storage_options), files_by_org
                )

    def run_one(requests: pa.Table, files_by_org: Mapping[str, list[WrittenFile]]) -> Iterator[pa.RecordBatch]:
        for orgs in org_chunks(sorted(pc.unique(requests["org_id"]).to_pylist()), files_by_org):
            of_orgs = requests.filter(pc.is_in(requests["org_id"], value_set=pa.array(orgs)))
            files = [f for org in orgs for f in files_by_org.get(org, ())]
            clock = [time.perf_counter()]

            def lap() -> int:
                clock.append(time.perf_counter())
                return round((clock[-1] - clock[-2]) * 1000)

            tables = read_planned(table_uri, files, storage_options)
            rows = pa.concat_tables(tables) if tables else ROWS_SCHEMA.empty_table()
            read_ms = lap()
            outcome = orgs_outcome(of_orgs, rows)
            compute_ms = lap()
            adds, removes = (
                rewrite_touched(table_uri, files, tables, outcome.source, tag, storage_options) if write else ([], [])
            )
            write_ms = lap()
            changes = change_rows(rows, outcome.source, ENGAGEMENT_ACTIVITY.schema)
            log_files = (
                []
                if log_version is None
                else write_files(
                    log_uri, ENGAGEMENT_ACTIVITY_CHANGES, stamped(changes, log_version), tag, storage_options
                )
            )
            stats = dict(
                applied=outcome.applied,
                actions=outcome.actions,
                rows_scanned=outcome.rows_scanned,
                files_read=len(files),
                **{k: outcome.counts[k] for k in ("updated", "replaced", "deleted", "unchanged")},
                task_read_ms=read_ms,
                task_compute_ms=compute_ms,
                task_write_ms=write_ms,
                task_changes_ms=lap(),
            )
            yield from handoff(STATS, pa.table({k: pa.array([stats[k]], pa.int64()) for k in STAT_NAMES}))
            yield from handoff(
                HELD,
                pa.table(
                    {
                        "candidate": pa.array(outcome.held, pa.int64()),
                        "missing": pa.array([json.dumps(outcome.missing[c]) for c in outcome.held], pa.string()),
                    }
                ),
            )
            yield from handoff(ADDS, pa.table({"file": pa.array([f.to_json() for f in adds], pa.string())}))
            yield from handoff(REMOVES, pa.table({"file": pa.array([f.to_json() for f in removes], pa.string())}))
            yield from handoff(LOG_ADDS, pa.table({"file": pa.array([f.to_json() for f in log_files], pa.string())}))
            yield from handoff(COUNTS, org_counts(changes))

    return run
