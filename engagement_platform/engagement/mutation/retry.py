"""When the mutation stream re-evaluates its pending requests without new ones (no Dagster).

A request whose target is not ingested yet waits in engagement_mutations_pending and is retried with
every mutation batch. With no new requests there would be no batch, so the sensor plans an empty slice
(the same next offsets) when one would change something:
- an ingestion batch has finished since the last mutation batch was planned (a pending target may have arrived);
- a pending request's age horizon (EP_MUTATION_PENDING_MAX_AGE_HOURS after the batch that first held it back)
  ran out since the last mutation batch was planned: it expires to quarantine then, not at some later batch,
  so in a quiet system no request stays pending past its horizon (without the empty slice, a target that
  never comes keeps a request pending for good, with nothing to retry it).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.ingestion.apply import STREAM as INGESTION_STREAM
from engagement_platform.engagement.mutation.pending import pending_max_age_hours
from engagement_platform.engagement.mutation.tables import ENGAGEMENT_MUTATIONS_PENDING
from engagement_platform.lake.checkpoints import BATCH, PLAN, CheckpointStore, planned_at_in
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.table_cache import TABLES
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import BatchPlan, KafkaSlice


def pending_first_seen(lake: DeltaLake) -> pa.Array | None:
    """When each pending request was first held back (one per row; None: no pending table). The mutation sensor asks
    on its idle ticks: the answer is kept (lake/table_cache.py) until the pending table moves."""

    def read() -> pa.Array | None:
        if not lake.exists(ENGAGEMENT_MUTATIONS_PENDING.name):
            return None
        return lake.read(ENGAGEMENT_MUTATIONS_PENDING.name, columns=["first_seen_at"])["first_seen_at"].combine_chunks()

    return TABLES.memo(lake, [ENGAGEMENT_MUTATIONS_PENDING.name], "mutation: pending first seen", read)


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


def horizon_ran_out(
    store: CheckpointStore, latest: BatchPlan | None, max_age_hours: float, now: datetime | None = None
) -> datetime | None:
    """The earliest moment a pending request's age horizon ran out after `latest` was planned and by `now`
    (None: no such request). A batch planned after that moment expires the request, so it is asked once."""
    if latest is None:
        return None
    first_seen = pending_first_seen(store.lake)
    if first_seen is None:
        return None
    planned = planned_at_in(store.rows(latest.stream), latest.batch_id)
    seen_at = first_seen.drop_null()
    if len(seen_at) == 0 or planned is None:
        return None
    now, max_age = now or datetime.now(UTC), timedelta(hours=max_age_hours)
    due = sorted(seen + max_age for seen in seen_at.to_pylist())
    return next((d for d in due if planned < d <= now), None)


def empty_slice_after(latest: BatchPlan, watermarks: dict[int, tuple[int, int]]) -> BatchPlan:
    """The next batch with nothing new to read: the same next offsets (a retry of the pending requests alone)."""
    ends = latest.ends()
    ranges = tuple(
        OffsetRange(p, max(ends.get(p, low), low), max(ends.get(p, low), low))
        for p, (low, _) in sorted(watermarks.items())
    )
    return BatchPlan(latest.stream, latest.batch_id + 1, KafkaSlice(latest.topic, ranges))


def pending_retry(
    store: CheckpointStore, latest: BatchPlan | None, watermarks: dict[int, tuple[int, int]]
) -> tuple[BatchPlan, int] | None:
    """(an empty slice after `latest`, the ingestion batch that makes it worth running) when the pending
    table is not empty and an ingestion batch finished after `latest` was planned; else None."""
    ingested = ingestion_done_after_plan(store, latest)
    if ingested is None or latest is None:
        return None
    first_seen = pending_first_seen(store.lake)
    if first_seen is None or len(first_seen) == 0:
        return None
    return empty_slice_after(latest, watermarks), ingested


def expiry_retry(
    store: CheckpointStore,
    latest: BatchPlan | None,
    watermarks: dict[int, tuple[int, int]],
    now: datetime | None = None,
) -> tuple[BatchPlan, datetime] | None:
    """(an empty slice after `latest`, the moment a pending request's age horizon ran out) when one ran out
    since `latest` was planned; else None."""
    due = horizon_ran_out(store, latest, pending_max_age_hours(), now)
    if due is None or latest is None:
        return None
    return empty_slice_after(latest, watermarks), due
