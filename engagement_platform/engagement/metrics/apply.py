"""Refresh `engagement_daily_metrics` from the changes notified since its checkpoint, exactly once.

The consumer pattern of the dashboards in Salesforce's "A High Performance Mutable Engagement Activity Delta
Lake": follow `engagement_notifications`, read only the changed rows (`changes_since`, every org, update
pre-images included), fold them into signed deltas (daily.py) and MERGE those into the metrics table. The consumer's checkpoint (the notification table's version it has read
up to) is the txn version of that same MERGE commit: the deltas and the checkpoint land together or not at
all, so a run killed anywhere re-reads from the checkpoint the table holds and adds each change once.
The commit also records which engagement_activity version the metrics now reflect, so the check can
recompute them from the table at exactly that version.

Notifications arrive in commit order of the notification table, not of the data table: a batch that
committed version 10 and crashed before its notification notifies it after version 11's.
So the metrics at a checkpoint hold every change up to the highest version read except a few versions still
unread; the commit records those (UNREAD), and the check subtracts their changes from the recomputation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import DeltaError

from engagement_platform.engagement.metrics.daily import KEYS, METRICS_SCHEMA, differences, metric_deltas
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_NOTIFICATIONS
from engagement_platform.lake.change_log import logged_versions
from engagement_platform.lake.changes import START, changes_since, commit_timestamps, feed_rows
from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec

APP_ID = "engagement.daily_metrics"
ACTIVITY_VERSION = "activity_version"  # commit metadata: the engagement_activity version the metrics reflect
UNREAD_BOUND_S = 3600  # a version unread this long after its commit fails the check (compare_with_recomputation)
UNREAD = (
    "unread_activity_versions"  # commit metadata: versions up to it whose changes are not read yet (comma-separated)
)

DAILY_METRICS = TableSpec(
    name="engagement_daily_metrics",
    schema=METRICS_SCHEMA,
    partition_by=(),  # small (org x day x type): one folder, compacted by delta-rs's own file sizing
    change_data_feed=False,
    description="Activities and call/meeting seconds per org, day and activity type, refreshed from engagement_activity's changes.",
)


@dataclass(frozen=True)
class Reflected:
    """Which engagement_activity changes the metrics hold: every version up to `version` except `unread`."""

    version: int | None  # None: no activity change read yet
    unread: tuple[int, ...] = ()

    def metadata(self) -> dict:
        return {ACTIVITY_VERSION: self.version, UNREAD: ",".join(map(str, self.unread))}


@dataclass(frozen=True)
class Refresh:
    checkpoint_before: int  # notification table version read up to before this refresh (START: nothing yet)
    checkpoint: int  # ... and after it
    reflected: Reflected  # the activity changes the metrics hold after it
    changed_rows: int  # change rows folded (pre- and post-images both count)
    keys_changed: int  # (org, day, type) keys the refresh added to, removed or created
    version: int | None  # the metrics table version this refresh committed (None: nothing new)

    @property
    def activity_version(self) -> int | None:
        return self.reflected.version

    def metadata(self) -> dict:
        return {
            "checkpoint_before": self.checkpoint_before,
            "checkpoint": self.checkpoint,
            "activity_version": self.activity_version,
            "unread_activity_versions": list(self.reflected.unread),
            "changed_rows": self.changed_rows,
            "keys_changed": self.keys_changed,
            "table_version": self.version,
        }


def checkpoint_of(lake: DeltaLake) -> int:
    """The notification table version the metrics have read up to (START before the first refresh)."""
    if not lake.exists(DAILY_METRICS.name):
        return START
    version = lake.committed_version(DAILY_METRICS.name, APP_ID)
    return START if version is None else version


def reflected_of(lake: DeltaLake) -> Reflected:
    """What the latest refresh that read any activity change recorded."""
    if not lake.exists(DAILY_METRICS.name):
        return Reflected(None)
    commit = lake.newest_commit(
        DAILY_METRICS.name, lambda c: c.get(ACTIVITY_VERSION) not in (None, "", "None"), recent=10
    )
    if commit is None:
        return Reflected(None)
    return Reflected(
        int(commit[ACTIVITY_VERSION]), tuple(int(v) for v in str(commit.get(UNREAD) or "").split(",") if v)
    )


def reflected_after(lake: DeltaLake, before: Reflected, read: list[int]) -> Reflected:
    """What the metrics hold once the changes of versions `read` are added to `before`: up to the highest
    version seen, except the versions below it that changed rows and were neither read now nor before.
    Versions already unread stay so until read, without being looked at again."""
    if not read:
        return before
    version = max(read) if before.version is None else max(before.version, *read)
    first = 1 if before.version is None else before.version + 1  # version 0 creates the table
    carried = set(before.unread) - set(read)
    fresh = changed_versions(lake, sorted(set(range(first, version + 1)) - set(read)))
    return Reflected(version, tuple(sorted(carried | set(fresh))))


def changed_versions(lake: DeltaLake, versions: list[int]) -> list[int]:
    """Those of `versions` (sorted) whose commit changed rows: a logged rewrite always does (it logs at least one
    row), any other commit iff its change feed has rows (a compaction's has none)."""
    if not versions:
        return []
    logged = set(logged_versions(lake, ENGAGEMENT_ACTIVITY.name, versions[0], versions[-1]))
    changed = []
    for v in versions:
        try:
            if v in logged or feed_rows(lake, ENGAGEMENT_ACTIVITY.name, [v], None).num_rows:
                changed.append(v)
        except DeltaError:  # log cleanup removed the version (a first refresh of an old table): nobody can read it
            continue
    return changed


def unread_deltas(lake: DeltaLake, reflected: Reflected) -> pa.Table:
    """The metric deltas of the unread versions, from their change feed: a rewrite's file-level feed counts every
    row of each removed file -1 and of each added file +1, which sums to the same deltas as its row-level log."""
    if not reflected.unread:
        return METRICS_SCHEMA.empty_table()
    return metric_deltas(
        pa.concat_tables(
            [feed_rows(lake, ENGAGEMENT_ACTIVITY.name, [v], None) for v in reflected.unread],
            promote_options="permissive",
        )
    )


def refresh_daily_metrics(lake: DeltaLake) -> Refresh:
    """Fold every change notified after the checkpoint into the metrics, with the new checkpoint, in one commit."""
    lake.ensure(DAILY_METRICS)
    before = checkpoint_of(lake)
    prior = reflected_of(lake)
    changes = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, ENGAGEMENT_ACTIVITY.name, None, before, preimages=True)
    if changes.checkpoint <= before:
        return Refresh(before, before, prior, 0, 0, None)
    reflected = reflected_after(lake, prior, changes.table_versions)
    deltas = metric_deltas(changes.rows)
    txn = BatchTxn(APP_ID, changes.checkpoint, {**reflected.metadata(), "changed_rows": changes.rows.num_rows})
    if (
        not deltas.num_rows
    ):  # nothing to add (other tables' notifications, or changes that cancel): the checkpoint alone
        version = lake.append(DAILY_METRICS, METRICS_SCHEMA.empty_table(), txn)
    else:
        on_keys = " AND ".join(f"t.{k} = s.{k}" for k in KEYS)
        (
            lake.merge(DAILY_METRICS, deltas, on_keys, txn)
            .when_matched_delete(predicate="t.activities + s.activities = 0")
            .when_matched_update(updates={m: f"t.{m} + s.{m}" for m in ("activities", "duration_seconds")})
            .when_not_matched_insert_all()
            .execute()
        )
        version = lake.table(DAILY_METRICS.name).version()
    return Refresh(before, changes.checkpoint, reflected, changes.rows.num_rows, deltas.num_rows, version)


@dataclass(frozen=True)
class Comparison:
    reflected: Reflected
    keys: int  # keys in the expected metrics
    activities_expected: int
    activities_stored: int
    keys_differing: int
    sample: list[dict]  # a few differing keys, for the check's metadata
    oldest_unread_age_s: float | None = None  # how long ago the oldest unread version was committed
    problem: str = ""  # why the metrics are wrong although no key differs (a notification lost), or cannot be checked

    @property
    def passed(self) -> bool:
        return self.keys_differing == 0 and not self.problem


def compare_with_recomputation(
    lake: DeltaLake, reflected: Reflected, recomputed: pa.Table, shown: int = 5, now_ms: int | None = None
) -> Comparison:
    """The stored metrics against what they must be: `recomputed`, the metrics of engagement_activity at
    reflected.version (recompute.py computes them in Spark tasks; tests also from the rows read whole), less the
    changes of the versions not read yet. A version still unread UNREAD_BOUND_S after its commit is a problem:
    its batch notifies when it finishes, so its notification was lost or its stream is stopped, and the
    metrics stay short of it until a person looks."""
    age, problem = None, ""
    try:
        unread = unread_deltas(lake, reflected)
    except DeltaError as exc:
        unread, problem = (
            METRICS_SCHEMA.empty_table(),
            f"unread versions {list(reflected.unread)} cannot be read any more: {exc}"[:300],
        )
    if reflected.unread and not problem:
        oldest = min(reflected.unread)
        committed = commit_timestamps(lake, ENGAGEMENT_ACTIVITY.name, [oldest]).get(oldest)
        age = None if committed is None else ((now_ms or int(time.time() * 1000)) - committed) / 1000
        if age is None or age > UNREAD_BOUND_S:
            problem = (
                f"version {oldest} changed rows but has not been notified {'since before the log kept' if age is None else f'in {age:.0f} s'}"
                f" (bound {UNREAD_BOUND_S} s): its batch's notification was lost or its stream is stopped"
            )
    expected = differences(recomputed, unread)  # recomputed - unread, keys at zero left out
    stored = lake.read(DAILY_METRICS.name) if lake.exists(DAILY_METRICS.name) else METRICS_SCHEMA.empty_table()
    diff = differences(expected, stored)
    total = lambda t: int(pc.sum(t["activities"]).as_py() or 0)  # noqa: E731
    return Comparison(
        reflected,
        expected.num_rows,
        total(expected),
        total(stored),
        diff.num_rows,
        [{k: str(v) for k, v in row.items()} for row in diff.slice(0, shown).to_pylist()],
        age,
        problem,
    )
