"""Delta tables over delta-rs: the one storage module every domain uses.

Spark computes; its results cross here as Arrow and are committed by delta-rs (no JVM jars needed).
Every write can carry a Delta `txn` action (app id, version) in the same commit as the rows, which is
what makes a retried batch a no-op on the tables it already reached (kafka-delta-ingest's idea).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError
from deltalake.table import FilterConjunctionType, TableMerger

from engagement_platform.lake.schema_evolution import evolve
from engagement_platform.lake.txn_log import TXN_LOG

LOG_RETENTION = "delta.logRetentionDuration"
HISTORY_ATTEMPTS = 20  # reads of a history that another writer's commit raced (history): each one is a fresh load

# A read filter: (column, operator, value), the operators of _compare.
Filter = tuple[str, str, Any]


@dataclass(frozen=True)
class TableSpec:
    """Everything needed to create a table the same way in every environment."""

    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...] = ()
    change_data_feed: bool = True
    # Columns that get min/max statistics (data skipping). Keep big JSON columns out of this list.
    stats_columns: tuple[str, ...] = ()
    target_file_size: int = 128 * 1024 * 1024
    description: str = ""
    # Who the columns come from ("pipeline <name>") when a config, not the code, decides them: its writer brings
    # the table to the config's schema (DeltaLake.ensure_config_schema).
    config_owner: str = ""

    def configuration(self) -> dict[str, str]:
        conf = {
            "delta.enableChangeDataFeed": "true" if self.change_data_feed else "false",
            "delta.targetFileSize": str(self.target_file_size),
        }
        if self.stats_columns:
            conf["delta.dataSkippingStatsColumns"] = ",".join(self.stats_columns)
        return conf


@dataclass(frozen=True)
class BatchTxn:
    """Identifies one batch's commit to a table: `app_id` is the writer, `version` the batch id."""

    app_id: str
    version: int
    metadata: dict[str, Any] = field(default_factory=dict)

    def commit_properties(self, extra: dict[str, Any] | None = None) -> CommitProperties:
        meta = {
            "app_id": self.app_id,
            "batch_id": str(self.version),
            **{k: str(v) for k, v in {**(extra or {}), **self.metadata}.items()},
        }
        return CommitProperties(
            app_transactions=[Transaction(app_id=self.app_id, version=self.version)],
            custom_metadata=meta,
        )


def batches_commit_properties(txns: list[BatchTxn], metadata: dict[str, Any] | None = None) -> CommitProperties:
    """One commit's properties for several batches: a txn action per app id (its newest version) and the
    shared metadata (a single batch keeps its own txn metadata as well)."""
    newest: dict[str, BatchTxn] = {}
    for txn in txns:
        if txn.app_id not in newest or newest[txn.app_id].version < txn.version:
            newest[txn.app_id] = txn
    if len(newest) == 1:
        return next(iter(newest.values())).commit_properties(metadata)
    return CommitProperties(
        app_transactions=[Transaction(app_id=t.app_id, version=t.version) for t in newest.values()],
        custom_metadata={
            "batches": str(len(newest)),
            **{k: str(v) for k, v in (metadata or {}).items()},
            **{batch_key(t.app_id): str(t.version) for t in newest.values()},
        },
    )


def batch_key(app_id: str) -> str:
    """Commit metadata key naming an app's batch in a commit shared by several batches (batch_commit finds it)."""
    return f"batch/{app_id}"


def holds_txn(table: DeltaTable, txn: BatchTxn) -> bool:
    """Whether the opened table (at the version it was loaded at) holds the batch's txn: an app's batch is
    committed once its version reached the batch's. One open table answers for many batches."""
    last = table.transaction_version(txn.app_id)
    return last is not None and last >= txn.version


class DeltaLake:
    """All tables under one root (a local folder or an object-store URI)."""

    def __init__(self, root: str, storage_options: dict[str, str] | None = None):
        # A relative folder is made absolute here, on the driver: Spark tasks resolve paths in their own
        # working directory, which on a cluster is a worker's folder, not the driver's.
        self.root = root.rstrip("/") if "://" in root else os.path.abspath(root)
        self.storage_options = storage_options

    def ensure_config_schema(self, spec: TableSpec) -> DeltaTable:
        """ensure(), then a config-owned table brought to its config's schema or refused (schema_evolution.py)."""
        return evolve(self.ensure(spec), spec, lambda: self.table(spec.name))

    def uri(self, name: str) -> str:
        return f"{self.root}/{name}"

    # ---- tables -------------------------------------------------------------------------------

    def ensure(self, spec: TableSpec) -> DeltaTable:
        """Open the table, creating it (schema, partitions, properties) on first use."""
        try:
            return self.table(spec.name)
        except TableNotFoundError:
            if "://" not in self.root:
                Path(self.uri(spec.name)).mkdir(parents=True, exist_ok=True)
            return DeltaTable.create(
                self.uri(spec.name),
                schema=spec.schema,
                mode="ignore",  # two processes creating at once both end with the same table
                partition_by=list(spec.partition_by) or None,
                name=spec.name,
                description=spec.description or None,
                configuration=spec.configuration(),
                storage_options=self.storage_options,
            )

    def table(self, name: str, version: int | None = None) -> DeltaTable:
        return DeltaTable(self.uri(name), version=version, storage_options=self.storage_options)

    def txn_versions(self, name: str, table: DeltaTable) -> Callable[[str], int | None]:
        """app id -> its txn version in the opened table (at the version it was loaded at): from the log read once
        per version (txn_log), so asking for many batches costs one read; delta-rs's own answer when the log
        cannot give an exact one."""
        known = TXN_LOG.versions(self.uri(name), self.storage_options, table.version())
        return table.transaction_version if known is None else known.get

    def history(self, name: str, limit: int | None = None, since: int | None = None) -> list[dict[str, Any]]:
        """The table's newest commit infos (all, the newest `limit`, or those from version `since` on), newest
        first, each with its true `version`.

        Use this, never DeltaTable.history(): delta-rs (1.6) reads the commits the store holds when history()
        is called but numbers them down from the version the DeltaTable was loaded at. A commit another writer
        makes in between shifts every number by one: a change-log version is then read as an ingestion's
        and the daily metrics drift. Versions only grow, so a read is kept when the table, brought up to date
        after it, is still at the version it was loaded at: then nothing was committed in between."""
        if limit is not None and since is not None:
            raise ValueError("history: give `limit` or `since`, not both")
        table = self.table(name)
        for attempt in range(HISTORY_ATTEMPTS):
            if attempt:
                time.sleep(min(0.05 * attempt, 1.0))  # a busy table: let its writers pass
            loaded = table.version()
            commits = table.history(limit=limit if since is None else max(loaded - since + 1, 1))
            table.update_incremental()
            if table.version() == loaded:
                return commits if since is None else [c for c in commits if c["version"] >= since]
        raise RuntimeError(f"{name}: the history of a table committed to {HISTORY_ATTEMPTS} times while it was read")

    def exists(self, name: str) -> bool:
        return DeltaTable.is_deltatable(self.uri(name), storage_options=self.storage_options)

    # ---- exactly-once commits -----------------------------------------------------------------

    def committed_version(self, name: str, app_id: str) -> int | None:
        """The last batch version `app_id` committed to this table (None if never)."""
        return self.table(name).transaction_version(app_id)

    def already_committed(self, name: str, txn: BatchTxn) -> bool:
        return holds_txn(self.table(name), txn)

    def append(self, spec: TableSpec, rows: pa.Table, txn: BatchTxn) -> int | None:
        """Append rows and the txn in one commit; None when this batch was already committed."""
        table = self.ensure(spec)
        if self.already_committed(spec.name, txn):
            return None
        write_deltalake(
            table,
            rows.select(spec.schema.names).cast(spec.schema),
            mode="append",
            schema_mode="merge",  # a spec that gained a column keeps writing to a table created before
            partition_by=list(spec.partition_by) or None,
            target_file_size=spec.target_file_size,
            commit_properties=txn.commit_properties(),
        )
        return table.version()  # the write left the object at its own commit (updating it could pass a later writer's)

    def append_many(
        self, spec: TableSpec, rows: list[tuple[BatchTxn, dict]], metadata: dict[str, Any] | None = None
    ) -> tuple[int | None, list[bool]]:
        """Rows of several batches in ONE commit carrying every batch's txn (the rows whose txn the table
        already has are left out, so each is still written exactly once): (the version written, None when
        nothing was left; for each row, whether it was written)."""
        table = self.ensure(spec)
        last_of = self.txn_versions(spec.name, table)
        fresh = []
        for txn, _ in rows:
            last = last_of(txn.app_id)
            fresh.append(last is None or last < txn.version)
        todo = [(txn, row) for (txn, row), new in zip(rows, fresh) if new]
        if not todo:
            return None, fresh
        props = batches_commit_properties([txn for txn, _ in todo], metadata)
        data = pa.Table.from_pylist(
            [{name: row.get(name) for name in spec.schema.names} for _, row in todo], schema=spec.schema
        )
        write_deltalake(
            table,
            data,
            mode="append",
            schema_mode="merge",
            partition_by=list(spec.partition_by) or None,
            target_file_size=spec.target_file_size,
            commit_properties=props,
        )
        return table.version(), fresh  # its own commit's version, as in append

    def delete(self, spec: TableSpec, predicate: str, txn: BatchTxn) -> dict[str, Any] | None:
        table = self.ensure(spec)
        if self.already_committed(spec.name, txn):
            return None
        metrics = table.delete(predicate, commit_properties=txn.commit_properties())
        return {**metrics, "version": table.version()}

    def update(self, spec: TableSpec, updates: dict[str, str], predicate: str, txn: BatchTxn) -> dict[str, Any] | None:
        """UPDATE the rows matching `predicate` (SQL expressions per column) with the txn; None when this batch was
        already committed."""
        table = self.ensure(spec)
        if self.already_committed(spec.name, txn):
            return None
        metrics = table.update(updates=updates, predicate=predicate, commit_properties=txn.commit_properties())
        return {**metrics, "version": table.version()}

    def merge(self, spec: TableSpec, source: pa.Table, predicate: str, txn: BatchTxn) -> TableMerger:
        """A TableMerger carrying the txn; the caller adds when_* clauses and calls execute()."""
        table = self.ensure(spec)
        return table.merge(
            source,
            predicate=predicate,
            source_alias="s",
            target_alias="t",
            commit_properties=txn.commit_properties(),
        )

    def batch_commit(self, name: str, app_id: str, version: int, recent: int = 200) -> dict[str, Any] | None:
        """The commit (history entry: version, operation metrics, custom metadata) in which `app_id`
        committed batch `version`; None if there is none, or no table.

        Looks at the newest `recent` commits first (a retried batch is almost always among them),
        and reads the whole history only if it is not there; not at all when the table's txn for
        `app_id` is below `version` (a batch's first attempt).
        """
        return self.batch_commits(name, [(app_id, version)], recent)[(app_id, version)]

    def batch_commits(
        self, name: str, batches: Sequence[tuple[str, int]], recent: int = 200
    ) -> dict[tuple[str, int], dict[str, Any] | None]:
        """batch_commit of several (app_id, batch) pairs from one table load and one read of its history."""
        found: dict[tuple[str, int], dict[str, Any] | None] = {b: None for b in batches}
        if not self.exists(name):
            return found
        table = self.table(name)
        last_of = self.txn_versions(name, table)
        wanted = {(app, v) for app, v in batches if (last_of(app) or -1) >= v}
        for limit in (recent, None):
            missing = {b for b in wanted if found[b] is None}
            if not missing:
                break
            for commit in self.history(name, limit=limit):  # newest first: the first match is the newest
                for app, v in list(missing):
                    if (commit.get("app_id") == app and commit.get("batch_id") == str(v)) or commit.get(
                        batch_key(app)
                    ) == str(v):
                        found[(app, v)] = commit
                        missing.discard((app, v))
                if not missing:
                    break
        return found

    def newest_commit(
        self, name: str, matches: Callable[[dict[str, Any]], bool], recent: int = 200
    ) -> dict[str, Any] | None:
        """The newest commit (history entry) that `matches`: the newest `recent` commits are read first, the whole
        history only when none of them matches."""
        for limit in (recent, None):
            commit = next((c for c in self.history(name, limit=limit) if matches(c)), None)
            if commit is not None or limit is None:
                return commit
        return None

    def find_batch_commit(self, name: str, app_id: str, version: int, recent: int = 200) -> int | None:
        """Table version at which `app_id` committed batch `version` (batch_commit)."""
        commit = self.batch_commit(name, app_id, version, recent)
        return None if commit is None else int(commit["version"])

    # ---- reads --------------------------------------------------------------------------------

    def read(self, name: str, filters: list[Filter] | None = None, columns: list[str] | None = None) -> pa.Table:
        """Rows with partition pruning and file skipping (min/max stats) from the filters (a string column
        that is not a partition column is compared as text_column)."""
        table = self.table(name)
        dataset, partitions = table.to_pyarrow_dataset(), set(table.metadata().partition_columns)
        expr = None
        for col, op, value in filters or []:
            kind = dataset.schema.field(col).type
            text = col not in partitions and (
                pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
            )
            term = _compare(text_column(col) if text else pc.field(col), op, value)
            expr = term if expr is None else expr & term
        return dataset.to_table(columns=columns, filter=expr)

    def changes(
        self, name: str, starting_version: int, ending_version: int | None = None, predicate: str | None = None
    ) -> pa.Table:
        """Change data feed rows (`_change_type`, `_commit_version`, `_commit_timestamp`)."""
        reader = self.table(name).load_cdf(
            starting_version=starting_version,
            ending_version=ending_version,
            predicate=predicate,
            allow_out_of_range=True,
        )
        table = pa.RecordBatchReader.from_stream(reader).read_all()
        # delta-rs returns string_view columns; plain strings sort/compare everywhere.
        return table.cast(pa.schema([_plain(f) for f in table.schema]))

    # ---- layout upkeep ------------------------------------------------------------------------

    def compact(
        self, name: str, partition_filters: FilterConjunctionType | None = None, target_size: int | None = None
    ) -> dict[str, Any]:
        return self.table(name).optimize.compact(partition_filters=partition_filters, target_size=target_size)

    def z_order(
        self,
        name: str,
        columns: list[str],
        partition_filters: FilterConjunctionType | None = None,
        target_size: int | None = None,
    ) -> dict[str, Any]:
        return self.table(name).optimize.z_order(columns, partition_filters=partition_filters, target_size=target_size)

    def vacuum(self, name: str, retention_hours: int, dry_run: bool = False) -> list[str]:
        return self.table(name).vacuum(
            retention_hours=retention_hours, dry_run=dry_run, enforce_retention_duration=retention_hours >= 168
        )

    def expire_log(self, name: str, retention_seconds: float) -> int:
        """Make log entries older than `retention_seconds` leave: the table's log retention set to it, a
        checkpoint of the current version written, then the older commit files and checkpoints deleted
        (delta-rs deletes only what precedes the newest checkpoint). An add action's statistics hold
        min/max values in clear, so an erased id stays in the log until this runs. Returns the new
        checkpoint's version."""
        table = self.table(name)
        wanted = f"interval {max(int(retention_seconds), 1)} seconds"
        if table.metadata().configuration.get(LOG_RETENTION) != wanted:
            table.alter.set_table_properties({LOG_RETENTION: wanted})
        table.create_checkpoint()
        table.cleanup_metadata()
        return table.version()

    def file_stats(self, name: str) -> pa.Table:
        """One row per data file: path, size, partition values, min/max stats (flattened)."""
        return pa.table(self.table(name).get_add_actions(flatten=True))


def text_column(name: str) -> pc.Expression:
    """A string column in a pyarrow dataset filter. Files that delta-rs's DML (DELETE, UPDATE, MERGE) rewrote
    hold string columns as string_view, which pyarrow's kernels (equal, is_in, the comparisons of a file's
    min/max guarantee) refuse: the whole scan fails (without the cast, every profile erasure batch after one
    whose DELETE rewrote a quarantine file fails, until the stream pauses). Through a cast every file reads.
    A table's partition columns need none (their values come from the log) and keep their pruning."""
    return pc.field(name).cast(pa.string())


def _compare(field_expr: pc.Expression, op: str, value: Any) -> pc.Expression:
    ops = {
        "=": lambda: field_expr == value,
        "!=": lambda: field_expr != value,
        "<": lambda: field_expr < value,
        "<=": lambda: field_expr <= value,
        ">": lambda: field_expr > value,
        ">=": lambda: field_expr >= value,
        "in": lambda: field_expr.isin(list(value)),
    }
    return ops[op]()


def _plain(f: pa.Field) -> pa.Field:
    if pa.types.is_string_view(f.type) or pa.types.is_large_string(f.type):
        return pa.field(f.name, pa.string(), f.nullable)
    if pa.types.is_binary_view(f.type) or pa.types.is_large_binary(f.type):
        return pa.field(f.name, pa.binary(), f.nullable)
    return f


def sql_literal(value: str) -> str:
    """A SQL string literal for delta-rs predicates (quotes doubled), for values we must inline."""
    return "'" + str(value).replace("'", "''") + "'"
