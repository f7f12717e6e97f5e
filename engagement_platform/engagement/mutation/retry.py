"""When the mutation stream re-evaluates its pending requests without new ones (no Dagster).

A request whose target is not ingested yet waits in engagement_mutations_pending and is retried with
every mutation batch. With no new requests there would be no batch, so the sensor plans an empty slice
(the same next offsets) once an ingestion batch has finished since the last mutation batch was planned:
only then can a pending target have arrived.
"""

from __future__ import annotations

import pyarrow.compute as pc

from engagement_platform.engagement.ingestion.apply import STREAM as INGESTION_STREAM
from engagement_platform.engagement.mutation.tables import ENGAGEMENT_MUTATIONS_PENDING
from engagement_platform.lake.checkpoints import BATCH, PLAN, CheckpointStore
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import BatchPlan, KafkaSlice


def ingestion_done_after_plan(store: CheckpointStore, plan: BatchPlan | None) -> int | None:
    """Id of the latest ingestion batch whose `done` was recorded after `plan` was (None: none since)."""
    if plan is None:
        return None
    mine = store.rows(plan.stream)
    mine = mine.filter(pc.and_(pc.equal(mine["batch_id"], plan.batch_id), pc.equal(mine["process"], PLAN)))
    rows = store.rows(INGESTION_STREAM)
    rows = rows.filter(pc.and_(pc.equal(rows["process"], BATCH), pc.equal(rows["state"], "done")))
    if mine.num_rows == 0 or rows.num_rows == 0:
        return None
    after = rows.filter(pc.greater(rows["recorded_at"], pc.min(mine["recorded_at"])))
    return pc.max(after["batch_id"]).as_py() if after.num_rows else None


def pending_retry(store: CheckpointStore, latest: BatchPlan | None, watermarks: dict[int, tuple[int, int]]) -> tuple[BatchPlan, int] | None:
    """(an empty slice after `latest`, the ingestion batch that makes it worth running) when the pending
    table is not empty and an ingestion batch finished after `latest` was planned; else None."""
    ingested = ingestion_done_after_plan(store, latest)
    if ingested is None or latest is None:
        return None
    lake = store.lake
    if not lake.exists(ENGAGEMENT_MUTATIONS_PENDING.name) or lake.table(ENGAGEMENT_MUTATIONS_PENDING.name).to_pyarrow_dataset().count_rows() == 0:
        return None
    ends = latest.ends()
    ranges = tuple(OffsetRange(p, max(ends.get(p, low), low), max(ends.get(p, low), low)) for p, (low, _) in sorted(watermarks.items()))
    return BatchPlan(latest.stream, latest.batch_id + 1, KafkaSlice(latest.topic, ranges)), ingested
