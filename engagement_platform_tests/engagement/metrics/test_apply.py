"""engagement_daily_metrics refreshed from real Delta commits (appends, a MERGE update, a delete, a commit
whose changes only the change log holds): equal to a recomputation after every refresh, each change counted
once, the checkpoint stored in the metrics table's own commit; and the check's recomputation in Spark tasks
equal to grouping the rows read whole."""

from __future__ import annotations

from datetime import date, datetime, timezone

import pyarrow as pa

from engagement_platform.engagement.metrics.apply import DAILY_METRICS, APP_ID, checkpoint_of, compare_with_recomputation, refresh_daily_metrics
from engagement_platform.engagement.metrics.daily import METRICS_SCHEMA, daily_metrics
from engagement_platform.engagement.metrics.recompute import recomputed_metrics
from engagement_platform.spark.handoff import dealt
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_NOTIFICATIONS
from engagement_platform.lake.changes import START
from engagement_platform.lake.delta import BatchTxn
from engagement_platform.lake.notifications import notification_rows

TABLE = ENGAGEMENT_ACTIVITY.name
D0 = date(2026, 3, 1)


def activity(items: list[tuple[str, str, date, str, int]], batch_id: int) -> pa.Table:
    now = datetime(2026, 3, 10, 12, tzinfo=timezone.utc)
    return pa.Table.from_pylist([
        dict(org_id=org, engagement_id=eid, engagement_date=day, activity_type=kind, lead_id=f"lead-{eid}", contact_id=None,
             account_id="acc", user_id="u", cadence_id=None, template_id=None, subject="s", call_outcome=None,
             duration_seconds=seconds, payload="{}", event_time=now, ingestion_time=now, source_partition=0, source_offset=i,
             batch_id=batch_id)
        for i, (org, eid, day, kind, seconds) in enumerate(items)], schema=ENGAGEMENT_ACTIVITY.schema)


def notify(lake, app: str, batch_id: int) -> None:
    version = lake.table(TABLE).version()
    lake.append(ENGAGEMENT_NOTIFICATIONS, notification_rows(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, version, app, batch_id), BatchTxn(app, batch_id))


def read_whole(lake, version: int | None) -> pa.Table:
    """The slow, obviously correct recomputation: every row of the table at `version` grouped on this process."""
    if version is None:
        return METRICS_SCHEMA.empty_table()
    return daily_metrics(lake.table(TABLE, version).to_pyarrow_table(columns=["org_id", "engagement_date", "activity_type", "duration_seconds"]))


def refreshed_and_equal(lake) -> int:
    refresh = refresh_daily_metrics(lake)
    compared = compare_with_recomputation(lake, refresh.activity_version, read_whole(lake, refresh.activity_version))
    assert compared.keys_differing == 0, compared.sample
    assert refresh.activity_version == lake.table(TABLE).version()
    return compared.activities_stored


def test_metrics_follow_inserts_updates_and_deletes_exactly_once(lake):
    lake.append(ENGAGEMENT_ACTIVITY, activity([("o1", "a", D0, "call", 60), ("o1", "b", D0, "call", 30), ("o2", "c", D0, "meeting", 600)], 1),
                BatchTxn("ingest", 1))
    notify(lake, "ingest", 1)
    assert refreshed_and_equal(lake) == 3
    first = checkpoint_of(lake)
    assert first != START and lake.committed_version(DAILY_METRICS.name, APP_ID) == first

    # an update that moves a row to another day and type (pre- and post-image), then a delete, then more inserts
    moved = activity([("o1", "a", D0.replace(day=2), "meeting", 45)], 2)
    (lake.merge(ENGAGEMENT_ACTIVITY, moved, "t.org_id = s.org_id AND t.engagement_id = s.engagement_id", BatchTxn("fix", 1))
     .when_matched_update({c: f"s.{c}" for c in ("engagement_date", "activity_type", "duration_seconds")}).execute())
    notify(lake, "fix", 1)
    lake.delete(ENGAGEMENT_ACTIVITY, "engagement_id = 'b'", BatchTxn("erase", 1))
    notify(lake, "erase", 1)
    lake.append(ENGAGEMENT_ACTIVITY, activity([("o2", "d", D0, "meeting", 5)], 3), BatchTxn("ingest", 3))
    notify(lake, "ingest", 3)
    assert refreshed_and_equal(lake) == 3  # a, c, d
    stored = {(r["org_id"], r["engagement_date"], r["activity_type"]): (r["activities"], r["duration_seconds"]) for r in lake.read(DAILY_METRICS.name).to_pylist()}
    assert stored == {("o1", D0.replace(day=2), "meeting"): (1, 45), ("o2", D0, "meeting"): (2, 605)}  # o1's day-1 calls are gone

    again = refresh_daily_metrics(lake)  # nothing new: no commit, the same checkpoint
    assert again.version is None and again.checkpoint == checkpoint_of(lake)
    versions = lake.table(DAILY_METRICS.name).version()
    assert refresh_daily_metrics(lake).version is None and lake.table(DAILY_METRICS.name).version() == versions


def test_a_refresh_whose_changes_cancel_still_stores_its_checkpoint(lake):
    lake.append(ENGAGEMENT_ACTIVITY, activity([("o1", "a", D0, "call", 60)], 1), BatchTxn("ingest", 1))
    notify(lake, "ingest", 1)
    lake.delete(ENGAGEMENT_ACTIVITY, "engagement_id = 'a'", BatchTxn("erase", 1))
    notify(lake, "erase", 1)
    refresh = refresh_daily_metrics(lake)
    assert refresh.changed_rows == 2 and refresh.keys_changed == 0 and refresh.version is not None
    assert checkpoint_of(lake) == lake.table(ENGAGEMENT_NOTIFICATIONS.name).version()
    assert lake.read(DAILY_METRICS.name).num_rows == 0
    assert compare_with_recomputation(lake, refresh.activity_version, read_whole(lake, refresh.activity_version)).keys_differing == 0


def test_files_are_dealt_to_tasks_once_each_and_no_task_is_empty():
    files = [(f"f{i}", f"o{i % 3}") for i in range(7)]
    for tasks in (1, 2, 4, 7, 50):
        shares = dealt(files, tasks)
        assert len(shares) == min(tasks, 7) and all(shares) and sorted(f for share in shares for f in share) == sorted(files)
    assert dealt([], 4) == [[]]


def test_spark_tasks_recompute_what_grouping_the_rows_read_whole_gives(spark, lake):
    assert recomputed_metrics(spark, lake, None).num_rows == 0
    for batch in range(1, 4):  # several files per org, over three orgs
        lake.append(ENGAGEMENT_ACTIVITY, activity([(f"o{i % 3}", f"e{batch}-{i}", D0.replace(day=1 + i % 4), ("call", "meeting")[i % 2], i)
                                                   for i in range(40)], batch), BatchTxn("ingest", batch))
    moved = activity([("o1", "e1-1", D0.replace(day=9), "email_sent", 7)], 9)
    (lake.merge(ENGAGEMENT_ACTIVITY, moved, "t.org_id = s.org_id AND t.engagement_id = s.engagement_id", BatchTxn("fix", 1))
     .when_matched_update({c: f"s.{c}" for c in ("engagement_date", "activity_type", "duration_seconds")}).execute())
    lake.delete(ENGAGEMENT_ACTIVITY, "engagement_id = 'e2-2'", BatchTxn("erase", 1))
    version = lake.table(TABLE).version()
    expected = read_whole(lake, version)
    assert expected.num_rows > 10 and expected.equals(recomputed_metrics(spark, lake, version))
    assert read_whole(lake, 0).equals(recomputed_metrics(spark, lake, 0)), "an older version reads that version's files"
