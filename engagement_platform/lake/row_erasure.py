"""Removing rows without naming them in the log, and making what erasure touched leave storage in time.

`erase_rows` rewrites the files that hold rows to remove (each read once, written anew without them) and
commits the removes and adds in ONE commit with the batch's txn and our own commit metadata. A delta-rs
DELETE would write its predicate into the log in clear, and a predicate on a person's id is the id. Use it
for tables without a change data feed (the rewrite writes no change-data files).

The window helpers run the same three passes over any list of tables: `checkpoint_tables` (right after an
erasure, so that later log cleanup can drop every entry before it), `vacuum_tables` (removed files older
than the retention) and `expire_logs` (log entries older than the retention, after a fresh checkpoint).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties
from deltalake.exceptions import CommitFailedError

from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec, sql_literal, text_column
from engagement_platform.lake.file_writes import (
    WrittenFile,
    commit_files,
    delete_uncommitted,
    filesystem,
    read_file,
    write_files,
    writer_tag,
)
from engagement_platform.lake.suppression import Suppressed

VACUUM_APP_ID = "lake.erasure_window.vacuum"


def live_files(lake: DeltaLake, spec: TableSpec, partition: dict[str, str] | None = None) -> list[WrittenFile]:
    """The table's current data files (optionally of one partition) as WrittenFile records."""
    if not lake.exists(spec.name):
        return []
    actions = lake.file_stats(spec.name)
    out = []
    for i, path in enumerate(actions["path"].to_pylist()):
        values = {c: actions[f"partition.{c}"][i].as_py() for c in spec.partition_by}
        if partition and any(values.get(k) != v for k, v in partition.items()):
            continue
        out.append(
            WrittenFile(path, actions["size_bytes"][i].as_py(), values, "{}", actions["modification_time"][i].as_py())
        )
    return out


def erase_rows(
    lake: DeltaLake,
    spec: TableSpec,
    files: Iterable[WrittenFile],
    remove: Callable[[pa.Table], pa.Array],
    txn: BatchTxn,
    metadata: Callable[[], dict] | None = None,
) -> tuple[int | None, int]:
    """Rewrite `files` without the rows `remove(rows) -> boolean mask` marks, in one commit carrying `txn`:
    (the commit's version, None when the batch already committed or nothing matched; rows removed).
    Files an earlier attempt of the batch wrote but never committed are deleted first. `metadata()` is asked
    for the commit's metadata once every file is read (e.g. counts `remove` tallied)."""
    if not lake.exists(spec.name) or lake.already_committed(spec.name, txn):
        return None, 0
    tag = writer_tag(txn.app_id, txn.version)
    delete_uncommitted(lake, spec, tag)
    uri, adds, removes, removed = lake.uri(spec.name), [], [], 0
    for f in files:
        rows = read_file(uri, spec, f, lake.storage_options)
        mask = pc.fill_null(remove(rows), False)
        hits = pc.sum(mask).as_py() or 0
        if not hits:
            continue
        removed += hits
        removes.append(f)
        kept = rows.filter(pc.invert(mask))
        if kept.num_rows:
            adds += write_files(uri, spec, kept, tag, lake.storage_options)
    if not removes:
        return None, 0
    return commit_files(
        lake, spec, adds, txn, removes, {"rewrite": "erase_rows", **(metadata() if metadata else {})}
    ), removed


def keyed_predicate(columns: tuple[str, str], keys: set[tuple[str, str]]) -> str | None:
    """`(a = 'x' AND b IN (...)) OR ...`: deletes exactly the rows picked by key, grouped by the first column."""
    grouped: dict[str, set[str]] = {}
    for a, b in keys:
        grouped.setdefault(a, set()).add(b)
    first, second = columns
    parts = [
        f"({first} = {sql_literal(a)} AND {second} IN ({', '.join(sql_literal(b) for b in sorted(bs))}))"
        for a, bs in sorted(grouped.items())
    ]
    return " OR ".join(parts) or None


def quarantined_keys_naming(
    lake: DeltaLake, spec: TableSpec, suppressed: Suppressed, expr: ds.Expression | None = None
) -> set[tuple[str, str]]:
    """(pipeline, row_id) of the quarantined records (QUARANTINE_SCHEMA) whose raw content or parsed input
    names a suppressed subject of their org / tenant (any, for a record without one)."""
    if not suppressed or not lake.exists(spec.name):
        return set()
    scoped = (
        text_column("org_id").isin(suppressed.scopes) | ds.field("org_id").is_null()
    )  # a data column of the quarantines
    rows = (
        lake.table(spec.name)
        .to_pyarrow_dataset()
        .to_table(
            columns=["pipeline", "row_id", "org_id", "raw", "input"], filter=scoped if expr is None else scoped & expr
        )
    )
    return {
        (r["pipeline"], r["row_id"])
        for r in rows.to_pylist()
        if suppressed.content_hit(r["org_id"], [r["raw"], r["input"]])
    }


def delete_quarantined(
    lake: DeltaLake, spec: TableSpec, keys: set[tuple[str, str]], txn: BatchTxn
) -> tuple[int | None, int]:
    """Delete those records by key with `txn`: (the commit's version, None when nothing matched; rows deleted)."""
    predicate = keyed_predicate(("pipeline", "row_id"), keys)
    if predicate is None:
        return None, 0
    metrics = lake.delete(spec, predicate, txn) or {}
    deleted = metrics.get("num_deleted_rows", 0)
    return (metrics["version"] if deleted else None), deleted


def purge_quarantine(lake: DeltaLake, spec: TableSpec, suppressed: Suppressed, app_id: str) -> int:
    """Delete by key the quarantined records naming a suppressed subject: what the upkeep sweeps up that no
    batch could, e.g. a malformed erasure request naming the subject a later valid one erased. Rows deleted.
    An upkeep run is its own writer: its txn version only has to grow."""
    keys = quarantined_keys_naming(lake, spec, suppressed)
    return delete_quarantined(lake, spec, keys, BatchTxn(app_id, int(time.time() * 1000)))[1] if keys else 0


def checkpoint_tables(lake: DeltaLake, names: Iterable[str]) -> list[str]:
    """A checkpoint of each table (delta-rs drops log entries only before a checkpoint that is itself older
    than the log retention: one written right after an erasure lets the cleanup past the retention drop
    everything from before it)."""
    done = []
    for name in names:
        if lake.exists(name):
            lake.table(name).create_checkpoint()
            done.append(name)
    return done


def vacuum_tables(lake: DeltaLake, names: Iterable[str], retention_hours: int) -> dict[str, int]:
    """Full vacuum (removed data and change-data files older than the retention, and orphans) of each table:
    files deleted per table (-1: the vacuum's log commit conflicted, retried next run)."""
    out = {}
    for name in names:
        if not lake.exists(name):
            continue
        try:
            out[name] = len(
                lake.table(name).vacuum(
                    retention_hours=retention_hours,
                    dry_run=False,
                    enforce_retention_duration=retention_hours >= 168,
                    full=True,
                    commit_properties=CommitProperties(custom_metadata={"app_id": VACUUM_APP_ID}),
                )
            )
        except CommitFailedError:
            out[name] = -1
    return out


def expire_logs(lake: DeltaLake, names: Iterable[str], retention_seconds: float) -> dict[str, int]:
    """DeltaLake.expire_log over the tables: table -> its new checkpoint's version (-1: a commit conflicted)."""
    out = {}
    for name in names:
        if not lake.exists(name):
            continue
        try:
            out[name] = lake.expire_log(name, retention_seconds)
        except CommitFailedError:
            out[name] = -1
    return out


def commit_bytes(lake: DeltaLake, name: str, version: int) -> tuple[int, int]:
    """(bytes the commit added, bytes it removed), from its log entry (the `size` of its add and remove
    actions): what an erasure batch reports as bytes rewritten. (0, 0) once log cleanup removed the entry."""
    fs, root = filesystem(lake.uri(name), lake.storage_options)
    try:
        with fs.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as f:
            lines = f.read().decode().splitlines()
    except (FileNotFoundError, OSError):
        return 0, 0
    added = removed = 0
    for line in lines:
        action = json.loads(line) if line.strip() else {}
        added += int((action.get("add") or {}).get("size") or 0)
        removed += int((action.get("remove") or {}).get("size") or 0)
    return added, removed
