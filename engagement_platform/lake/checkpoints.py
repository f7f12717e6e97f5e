"""Checkpoint store: per stream and batch, the planned slice and the state of each process.

An append-only Delta table (appends never conflict, so every stream shares it). The latest row per
(stream, batch, process) is the state. The plan row is written once per batch (its own txn), before
the run is requested, so a retry reads the same slice. Which tables already hold a batch is decided
by their Delta txn versions, not by this table: this table is the plan plus an audit trail.

Each row carries its batch's slice in the `topic` and `ranges` columns (streams/slices.py says how).
Writes of many batches (`record_plans`, `finish_batches`) are one commit with one txn per row, so a
stream that runs many batches at once (the profile processor, a batch per tenant) pays one commit.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import TableNotFoundError

from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec
from engagement_platform.lake.file_writes import filesystem, read_parquet
from engagement_platform.lake.table_cache import TABLES, PartitionScope
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.slices import from_columns, to_columns

T = TypeVar("T")
PLAN = "plan"
BATCH = "batch"  # the whole batch: state "done" once every table is committed
COMPACT_EVERY = 200  # batches between compactions of a stream's checkpoint partition

CHECKPOINTS = TableSpec(
    name="checkpoints",
    schema=pa.schema(
        [
            ("stream", pa.string()),
            ("batch_id", pa.int64()),
            ("process", pa.string()),
            ("state", pa.string()),
            ("topic", pa.string()),
            ("ranges", pa.string()),
            ("table_version", pa.int64()),
            ("detail", pa.string()),
            ("recorded_at", pa.timestamp("us", tz="UTC")),
        ]
    ),
    partition_by=("stream",),
    change_data_feed=False,
    description="Batch plans and per-process state of every stream.",
)

Outcomes = dict[str, int | None]  # table -> version the batch committed (None: it was already there)
# The order rows_of returns rows in, the same for a fresh read and a kept one: Delta promises no order, and a kept
# answer outlives commits to other streams (one of which may write a log checkpoint that lists files differently).
# Stream first, so the rows of several streams come grouped; then the columns that tell one row from another.
ROW_ORDER = ("stream", "batch_id", "process", "state", "recorded_at", "topic", "ranges", "table_version", "detail")


@dataclass(frozen=True)
class BatchState:
    """One state row: `process` (a table, or BATCH for the whole batch) of the plan's batch reached `state`."""

    plan: BatchPlan
    process: str
    state: str
    table_version: int | None = None
    detail: dict = field(default_factory=dict)


def outcome_states(plan: BatchPlan, outcomes: Outcomes) -> list[BatchState]:
    """A finished batch's state rows: each table committed (or already there), then the batch done."""
    states = [
        BatchState(plan, name, "committed" if v is not None else "already_committed", v) for name, v in outcomes.items()
    ]
    return states + [BatchState(plan, BATCH, "done", detail={f"{k}_version": v for k, v in outcomes.items()})]


def _row(plan: BatchPlan, process: str, state: str, at: datetime, **columns: Any) -> dict:
    topic, ranges = to_columns(plan.slice)
    return dict(
        stream=plan.stream,
        batch_id=plan.batch_id,
        process=process,
        state=state,
        topic=topic,
        ranges=ranges,
        recorded_at=at,
        **columns,
    )


@dataclass(frozen=True)
class LatestBatch:
    plan: BatchPlan | None
    done: bool
    planned_at: datetime | None  # when the plan was recorded (a cadence's wait counts from it)


class CheckpointStore:
    def __init__(self, lake: DeltaLake):
        self.lake = lake

    # ---- writes -------------------------------------------------------------------------------

    def _append(self, rows: list[tuple[BatchTxn, dict]], **metadata: Any) -> list[bool]:
        """The rows in one commit (rows whose txn is already there skipped): which were written."""
        return self.lake.append_many(CHECKPOINTS, rows, metadata)[1] if rows else []

    def _append_states(self, states: list[BatchState], **metadata: Any) -> None:
        """State rows in one commit, then the compaction rule: a stream's partition is compacted when one
        of its batches numbered a multiple of COMPACT_EVERY is done."""
        now = datetime.now(UTC)
        # State rows are an audit log: several per batch are fine, so the txn is per process and state.
        self._append(
            [
                (
                    BatchTxn(f"{s.plan.stream}/{s.process}/{s.state}", s.plan.batch_id),
                    _row(
                        s.plan,
                        s.process,
                        s.state,
                        now,
                        table_version=s.table_version,
                        detail=json.dumps(s.detail, default=str),
                    ),
                )
                for s in states
            ],
            **metadata,
        )
        # Each batch appends a few tiny files and every sensor tick reads the stream's partition.
        for stream in sorted(
            {
                s.plan.stream
                for s in states
                if s.process == BATCH and s.state == "done" and s.plan.batch_id % COMPACT_EVERY == 0
            }
        ):
            self.lake.compact(CHECKPOINTS.name, partition_filters=[("stream", "=", stream)])

    def record_plan(self, plan: BatchPlan) -> bool:
        """Store the plan once; False if this batch id was already planned (by an earlier tick)."""
        return bool(self.record_plans([plan]))

    def record_plans(self, plans: list[BatchPlan]) -> list[BatchPlan]:
        """record_plan for many plans in one commit (one txn per plan): the plans stored now."""
        now = datetime.now(UTC)
        written = self._append(
            [(BatchTxn(f"{p.stream}/plan", p.batch_id), _row(p, PLAN, "planned", now)) for p in plans]
        )
        return [p for p, new in zip(plans, written) if new]

    def record_state(
        self, plan: BatchPlan, process: str, state: str, table_version: int | None = None, **detail: Any
    ) -> None:
        self._append_states([BatchState(plan, process, state, table_version, detail)])

    def mark_done(self, plan: BatchPlan, **detail: Any) -> None:
        self._append_states([BatchState(plan, BATCH, "done", detail=detail)])

    def finish_batches(self, finished: list[tuple[BatchPlan, Outcomes]], **metadata: Any) -> None:
        """Every finished batch's outcome_states, in one commit."""
        self._append_states([s for plan, outcomes in finished for s in outcome_states(plan, outcomes)], **metadata)

    # ---- reads --------------------------------------------------------------------------------

    def rows(self, stream: str) -> pa.Table:
        return self.rows_of([stream])

    def rows_of(self, streams: list[str]) -> pa.Table:
        """The rows of every stream in `streams`, from one read, in ROW_ORDER."""
        wanted = sorted(set(streams))
        return self._kept("rows", wanted, lambda: self._read_rows(wanted))

    def _kept(self, question: str, streams: list[str], compute: Callable[[], T]) -> T:
        """`compute()`'s answer about these streams, kept (table_cache) until a commit adds or removes files of
        their partitions: every sensor tick asks where its stream stands, and a tick of a stream nobody committed
        to since then costs one stat call on the log instead of a read of the table."""
        scope = PartitionScope("stream", frozenset(streams))
        return TABLES.answer(self.lake, CHECKPOINTS.name, (question, tuple(streams)), compute, scope)

    def _read_rows(self, streams: list[str]) -> pa.Table:
        try:
            if len(streams) == 1:
                rows = self.lake.read(CHECKPOINTS.name, filters=[("stream", "=", streams[0])])
            else:
                rows = self.lake.read(CHECKPOINTS.name, filters=[("stream", "in", streams)])
        except TableNotFoundError:
            return CHECKPOINTS.schema.empty_table()
        return rows.sort_by([(column, "ascending") for column in ROW_ORDER if column in rows.column_names])

    def _rows_from_newest(self, streams: list[str]) -> pa.Table:
        """The rows of each of `streams` from its newest batch on, in ROW_ORDER: enough to tell its latest
        batch. Which files hold them comes from the files' batch_id statistics in the log, and only those
        are read, each directly (a stream's partition gains a plan file and a finish file every batch: a
        dataset over hundreds of small files costs far more than the two that matter). A stream with a file
        without statistics is read whole."""
        try:
            stats = self.lake.file_stats(CHECKPOINTS.name)
        except TableNotFoundError:
            return CHECKPOINTS.schema.empty_table()
        if "partition.stream" not in stats.column_names:
            return self._read_rows(streams)
        stats = stats.filter(pc.is_in(stats["partition.stream"], value_set=pa.array(streams, pa.string())))
        paths, partitions = stats["path"].to_pylist(), stats["partition.stream"].to_pylist()
        highest = stats["max.batch_id"].to_pylist() if "max.batch_id" in stats.column_names else [None] * len(paths)
        newest: dict[str, int | None] = {}
        for stream, high in zip(partitions, highest):
            known = newest.get(stream, -1)
            newest[stream] = None if high is None or known is None else max(known, high)
        fs, root = filesystem(self.lake.uri(CHECKPOINTS.name), self.lake.storage_options)
        parts = []
        for path, stream, high in zip(paths, partitions, highest):
            floor = newest[stream]
            if floor is not None and high is not None and high < floor:
                continue  # holds batches before the stream's newest only
            rows = read_parquet(fs, f"{root}/{unquote(path)}")
            for column in CHECKPOINTS.schema:  # the partition column lives in the log; older files may lack some
                if column.name not in rows.column_names:
                    value = stream if column.name == "stream" else None
                    rows = rows.append_column(column.name, pa.array([value] * rows.num_rows, column.type))
            if floor is not None:
                rows = rows.filter(pc.greater_equal(rows["batch_id"], floor))
            parts.append(rows.select(CHECKPOINTS.schema.names).cast(CHECKPOINTS.schema))
        rows = pa.concat_tables(parts) if parts else CHECKPOINTS.schema.empty_table()
        return rows.sort_by([(column, "ascending") for column in ROW_ORDER if column in rows.column_names])

    def plans(self, stream: str) -> list[BatchPlan]:
        """The stream's plans by batch id (a new list each call: the kept one is shared)."""
        return list(self._kept("plans", [stream], lambda: tuple(plans_from_rows(stream, self.rows(stream)))))

    def plans_and_done(self, stream: str) -> list[tuple[BatchPlan, bool]]:
        """Every plan of the stream by batch id, with whether its batch is done, from one read."""
        rows = self.rows(stream)
        finished = rows.filter(pc.and_(pc.equal(rows["process"], BATCH), pc.equal(rows["state"], "done")))
        done = set(finished["batch_id"].to_pylist())
        return [(p, p.batch_id in done) for p in plans_from_rows(stream, rows)]

    def plan(self, stream: str, batch_id: int) -> BatchPlan:
        for p in self.plans(stream):
            if p.batch_id == batch_id:
                return p
        raise LookupError(f"no plan for {stream} batch {batch_id}")

    def latest_plan(self, stream: str) -> BatchPlan | None:
        plans = self.plans(stream)
        return plans[-1] if plans else None

    def latest(self, stream: str) -> tuple[BatchPlan | None, bool]:
        """(latest plan, whether it is done), from one read: what the sensor asks on every tick."""
        return self.latest_of([stream])[stream]

    def latest_of(self, streams: list[str]) -> dict[str, tuple[BatchPlan | None, bool]]:
        """`latest` of every stream in `streams`, from one read."""
        return {stream: (b.plan, b.done) for stream, b in self.latest_batches(streams).items()}

    def latest_batches(self, streams: list[str]) -> dict[str, LatestBatch]:
        """Each stream's latest plan, whether it is done and when it was planned, from one read."""
        wanted = sorted(set(streams))
        latest = self._kept("latest batches", wanted, lambda: self._latest_batches(wanted))
        return {stream: latest[stream] for stream in streams}

    def _latest_batches(self, streams: list[str]) -> dict[str, LatestBatch]:
        by_stream = _split_by(self._rows_from_newest(streams), "stream")
        out = {}
        for stream in streams:
            rows = by_stream.get(stream, CHECKPOINTS.schema.empty_table())
            plans = plans_from_rows(stream, rows)
            if not plans:
                out[stream] = LatestBatch(None, False, None)
                continue
            latest = plans[-1]
            out[stream] = LatestBatch(
                latest,
                states_from_rows(rows, latest.batch_id).get(BATCH) == "done",
                planned_at_in(rows, latest.batch_id),
            )
        return out

    def planned_at(self, stream: str, batch_id: int) -> datetime | None:
        """When the batch's plan was recorded (None if it never was)."""
        return planned_at_in(self.rows(stream), batch_id)

    def states(self, stream: str, batch_id: int) -> dict[str, str]:
        """process -> latest state for one batch."""
        return states_from_rows(self.rows(stream), batch_id)

    def is_done(self, stream: str, batch_id: int) -> bool:
        return self.states(stream, batch_id).get(BATCH) == "done"


def planned_at_in(rows: pa.Table, batch_id: int) -> datetime | None:
    """When the batch's plan row was recorded, among checkpoint rows of its stream."""
    rows = rows.filter(pc.and_(pc.equal(rows["batch_id"], batch_id), pc.equal(rows["process"], PLAN)))
    return rows["recorded_at"][0].as_py() if rows.num_rows else None


def plans_from_rows(stream: str, rows: pa.Table) -> list[BatchPlan]:
    """The stream's plans among checkpoint rows (of that stream), by batch id."""
    rows = rows.filter(pc.equal(rows["process"], PLAN)).to_pylist()
    return sorted(
        (BatchPlan(stream, r["batch_id"], from_columns(r["topic"], r["ranges"])) for r in rows),
        key=lambda p: p.batch_id,
    )


def states_from_rows(rows: pa.Table, batch_id: int) -> dict[str, str]:
    """process -> latest state of one batch, among checkpoint rows of its stream."""
    rows = rows.filter(pc.equal(rows["batch_id"], batch_id)).sort_by("recorded_at").to_pylist()
    return {r["process"]: r["state"] for r in rows}


def _split_by(rows: pa.Table, column: str) -> dict[str, pa.Table]:
    """value -> its rows: runs of equal values are found without sorting when the rows arrive grouped
    (one stream's partition is read after another); a table that is not grouped is sorted first."""
    if not rows.num_rows:
        return {}
    runs = pc.run_end_encode(rows[column].combine_chunks())
    values = runs.values.to_pylist()
    if len(set(values)) < len(values):
        return _split_by(rows.sort_by(column), column)
    out, start = {}, 0
    for value, end in zip(values, runs.run_ends.to_pylist()):
        out[value] = rows.slice(start, end - start)
        start = end
    return out
