"""Refresh `engagement_daily_metrics` from the changes notified since its checkpoint, exactly once.

The consumer pattern of reference 000's dashboards: follow `engagement_notifications`, read only the changed
rows (`changes_since`, every org, update pre-images included), fold them into signed deltas (daily.py) and
MERGE those into the metrics table. The consumer's checkpoint (the notification table's version it has read
up to) is the txn version of that same MERGE commit: the deltas and the checkpoint land together or not at
all, so a run killed anywhere re-reads from the checkpoint the table holds and adds each change once.
The commit also records which engagement_activity version the metrics now reflect, so the check can
recompute them from the table at exactly that version.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.metrics.daily import KEYS, METRICS_SCHEMA, differences, metric_deltas
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_NOTIFICATIONS
from engagement_platform.lake.changes import START, changes_since
from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec

APP_ID = "engagement.daily_metrics"
ACTIVITY_VERSION = "activity_version"  # commit metadata: the engagement_activity version the metrics reflect

DAILY_METRICS = TableSpec(
    name="engagement_daily_metrics",
    schema=METRICS_SCHEMA,
    partition_by=(),  # small (org x day x type): one folder, compacted by delta-rs's own file sizing
    change_data_feed=False,
    description="Activities and call/meeting seconds per org, day and activity type, refreshed from engagement_activity's changes.",
)


@dataclass(frozen=True)
class Refresh:
    checkpoint_before: int  # notification table version read up to before this refresh (START: nothing yet)
    checkpoint: int  # ... and after it
    activity_version: int | None  # the engagement_activity version the metrics reflect (None: no activity yet)
    changed_rows: int  # change rows folded (pre- and post-images both count)
    keys_changed: int  # (org, day, type) keys the refresh added to, removed or created
    version: int | None  # the metrics table version this refresh committed (None: nothing new)

    def metadata(self) -> dict:
        return {"checkpoint_before": self.checkpoint_before, "checkpoint": self.checkpoint, "activity_version": self.activity_version,
                "changed_rows": self.changed_rows, "keys_changed": self.keys_changed, "table_version": self.version}


def checkpoint_of(lake: DeltaLake) -> int:
    """The notification table version the metrics have read up to (START before the first refresh)."""
    if not lake.exists(DAILY_METRICS.name):
        return START
    version = lake.committed_version(DAILY_METRICS.name, APP_ID)
    return START if version is None else version


def reflected_activity_version(lake: DeltaLake) -> int | None:
    """The engagement_activity version recorded by the latest refresh that read any activity change."""
    if not lake.exists(DAILY_METRICS.name):
        return None
    for commit in lake.table(DAILY_METRICS.name).history():
        if commit.get(ACTIVITY_VERSION) not in (None, "", "None"):
            return int(commit[ACTIVITY_VERSION])
    return None


def refresh_daily_metrics(lake: DeltaLake) -> Refresh:
    """Fold every change notified after the checkpoint into the metrics, with the new checkpoint, in one commit."""
    lake.ensure(DAILY_METRICS)
    before = checkpoint_of(lake)
    changes = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, ENGAGEMENT_ACTIVITY.name, None, before, preimages=True)
    if changes.checkpoint <= before:
        return Refresh(before, before, reflected_activity_version(lake), 0, 0, None)
    activity_version = max(changes.table_versions) if changes.table_versions else reflected_activity_version(lake)
    deltas = metric_deltas(changes.rows)
    txn = BatchTxn(APP_ID, changes.checkpoint, {ACTIVITY_VERSION: activity_version, "changed_rows": changes.rows.num_rows})
    if not deltas.num_rows:  # nothing to add (other tables' notifications, or changes that cancel): the checkpoint alone
        version = lake.append(DAILY_METRICS, METRICS_SCHEMA.empty_table(), txn)
    else:
        on_keys = " AND ".join(f"t.{k} = s.{k}" for k in KEYS)
        (lake.merge(DAILY_METRICS, deltas, on_keys, txn)
         .when_matched_delete(predicate="t.activities + s.activities = 0")
         .when_matched_update(updates={m: f"t.{m} + s.{m}" for m in ("activities", "duration_seconds")})
         .when_not_matched_insert_all()
         .execute())
        version = lake.table(DAILY_METRICS.name).version()
    return Refresh(before, changes.checkpoint, activity_version, changes.rows.num_rows, deltas.num_rows, version)


@dataclass(frozen=True)
class Comparison:
    activity_version: int | None
    keys: int  # keys in the recomputation
    activities_expected: int
    activities_stored: int
    keys_differing: int
    sample: list[dict]  # a few differing keys, for the check's metadata


def compare_with_recomputation(lake: DeltaLake, activity_version: int | None, expected: pa.Table, shown: int = 5) -> Comparison:
    """The stored metrics against `expected`, the metrics recomputed from engagement_activity at the version they
    reflect (recompute.py does it in Spark tasks; tests also from the rows read whole)."""
    stored = lake.read(DAILY_METRICS.name) if lake.exists(DAILY_METRICS.name) else METRICS_SCHEMA.empty_table()
    diff = differences(expected, stored)
    total = lambda t: int(pc.sum(t["activities"]).as_py() or 0)  # noqa: E731
    return Comparison(activity_version, expected.num_rows, total(expected), total(stored), diff.num_rows,
                      [{k: str(v) for k, v in row.items()} for row in diff.slice(0, shown).to_pylist()])
