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

import pyarrow.compute as pc

from engagement_platform.engagement.ingestion.apply import STREAM as INGESTION_STREAM
from engagement_platform.engagement.mutation.pending import pending_max_age_hours
from engagement_platform.engagement.mutation.tables import ENGAGEMENT_MUTATIONS_PENDING
from engagement_platform.lake.checkpoints import BATCH, PLAN, CheckpointStore, planned_at_in
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


def horizon_ran_out(
    store: CheckpointStore, latest: BatchPlan | None, max_age_hours: float, now: datetime | None = None
) -> datetime | None:
    """The earliest moment a pending request's age horizon ran out after `latest` was planned and by `now`
    (None: no such request). A batch planned after that moment expires the request, so it is asked once."""
    if latest is None:
        return None
    lake = store.lake
    if not lake.exists(ENGAGEMENT_MUTATIONS_PENDING.name):
        return None
    first_seen = lake.read(ENGAGEMENT_MUTATIONS_PENDING.name, columns=["first_seen_at"])["first_seen_at"].drop_null()
    planned = planned_at_in(store.rows(latest.stream), latest.batch_id)
    if len(first_seen) == 0 or planned is None:
        return None
    now, max_age = now or datetime.now(UTC), timedelta(hours=max_age_hours)
    due = sorted(seen + max_age for seen in first_seen.to_pylist())
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
    lake = store.lake
    if (
        not lake.exists(ENGAGEMENT_MUTATIONS_PENDING.name)
        or lake.table(ENGAGEMENT_MUTATIONS_PENDING.name).to_pyarrow_dataset().count_rows() == 0
    ):
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
