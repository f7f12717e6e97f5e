"""The mutation sensor's idle questions of the pending table, without servers: answered from the table as it is
now, and kept between ticks until the table moves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import write_deltalake

from engagement_platform.engagement.mutation.retry import horizon_ran_out, pending_first_seen
from engagement_platform.engagement.mutation.tables import ENGAGEMENT_MUTATIONS_PENDING
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import BatchPlan, KafkaSlice

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def hold_back(lake: DeltaLake, *first_seen: datetime | None, mode: str = "append") -> None:
    rows = pa.table({"first_seen_at": pa.array(first_seen, pa.timestamp("us", tz="UTC"))})
    write_deltalake(lake.uri(ENGAGEMENT_MUTATIONS_PENDING.name), rows, mode=mode)


def test_the_pending_table_is_read_as_it_is_now_and_not_again_while_it_stays(tmp_path, monkeypatch):
    lake = DeltaLake(str(tmp_path / "lake"))
    assert pending_first_seen(lake) is None
    hold_back(lake, T0, None)
    reads = []
    read = DeltaLake.read
    monkeypatch.setattr(DeltaLake, "read", lambda self, *a, **k: reads.append(a) or read(self, *a, **k))
    assert pending_first_seen(lake).to_pylist() == [T0, None]
    assert pending_first_seen(lake).to_pylist() == [T0, None] and len(reads) == 1
    hold_back(lake, mode="overwrite")  # every pending request applied or expired
    assert pending_first_seen(lake).to_pylist() == [] and len(reads) == 2


def test_the_horizon_runs_out_after_the_batch_was_planned(tmp_path):
    lake = DeltaLake(str(tmp_path / "lake"))
    store = CheckpointStore(lake)
    plan = BatchPlan("mutation", 1, KafkaSlice("t", (OffsetRange(0, 0, 1),)))
    store.record_plan(plan)
    planned = store.latest_batches(["mutation"])["mutation"].planned_at
    assert horizon_ran_out(store, plan, 1.0) is None, "no pending table"
    hold_back(lake, planned - timedelta(minutes=30), None)
    due = planned + timedelta(minutes=30)
    assert horizon_ran_out(store, plan, 1.0, now=due) == due
    assert horizon_ran_out(store, plan, 1.0, now=due - timedelta(seconds=1)) is None
