"""Checkpoint store: per stream and batch, the planned slice and the state of each process.

An append-only Delta table (appends never conflict, so every stream shares it). The latest row per
(stream, batch, process) is the state. The plan row is written once per batch (its own txn), before
the run is requested, so a retry reads the same slice. Which tables already hold a batch is decided
by their Delta txn versions, not by this table: this table is the plan plus an audit trail.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec
from engagement_platform.streams.planning import BatchPlan

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


class CheckpointStore:
    def __init__(self, lake: DeltaLake):
        self.lake = lake

    def _append(self, rows: list[dict], txn: BatchTxn) -> int | None:
        now = datetime.now(timezone.utc)
        for row in rows:
            row.setdefault("recorded_at", now)
            for col in CHECKPOINTS.schema.names:
                row.setdefault(col, None)
        return self.lake.append(CHECKPOINTS, pa.Table.from_pylist(rows, schema=CHECKPOINTS.schema), txn)

    def record_plan(self, plan: BatchPlan) -> bool:
        """Store the plan once; False if this batch id was already planned (by an earlier tick)."""
        row = dict(stream=plan.stream, batch_id=plan.batch_id, process=PLAN, state="planned", topic=plan.topic, ranges=plan.ranges_json())
        return self._append([row], BatchTxn(f"{plan.stream}/plan", plan.batch_id)) is not None

    def record_state(self, plan: BatchPlan, process: str, state: str, table_version: int | None = None, **detail) -> None:
        row = dict(
            stream=plan.stream, batch_id=plan.batch_id, process=process, state=state, topic=plan.topic,
            ranges=plan.ranges_json(), table_version=table_version, detail=json.dumps(detail, default=str),
        )
        # State rows are an audit log: several per batch are fine, so the txn is per process.
        self._append([row], BatchTxn(f"{plan.stream}/{process}/{state}", plan.batch_id))

    def rows(self, stream: str) -> pa.Table:
        if not self.lake.exists(CHECKPOINTS.name):
            return CHECKPOINTS.schema.empty_table()
        return self.lake.read(CHECKPOINTS.name, filters=[("stream", "=", stream)])

    def plans(self, stream: str) -> list[BatchPlan]:
        return _plans(stream, self.rows(stream))

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
        rows = self.rows(stream)
        plans = _plans(stream, rows)
        if not plans:
            return None, False
        return plans[-1], _states(rows, plans[-1].batch_id).get(BATCH) == "done"

    def states(self, stream: str, batch_id: int) -> dict[str, str]:
        """process -> latest state for one batch."""
        return _states(self.rows(stream), batch_id)

    def is_done(self, stream: str, batch_id: int) -> bool:
        return self.states(stream, batch_id).get(BATCH) == "done"

    def mark_done(self, plan: BatchPlan, **detail) -> None:
        self.record_state(plan, BATCH, "done", **detail)
        if plan.batch_id % COMPACT_EVERY == 0:
            # Each batch appends ~5 tiny files and every sensor tick reads the stream's partition.
            self.lake.compact(CHECKPOINTS.name, partition_filters=[("stream", "=", plan.stream)])


def _plans(stream: str, rows: pa.Table) -> list[BatchPlan]:
    rows = rows.filter(pc.equal(rows["process"], PLAN)).to_pylist()
    return sorted(
        (BatchPlan(stream, r["batch_id"], r["topic"], BatchPlan.ranges_from_json(r["ranges"])) for r in rows),
        key=lambda p: p.batch_id,
    )


def _states(rows: pa.Table, batch_id: int) -> dict[str, str]:
    rows = rows.filter(pc.equal(rows["batch_id"], batch_id)).sort_by("recorded_at").to_pylist()
    return {r["process"]: r["state"] for r in rows}
