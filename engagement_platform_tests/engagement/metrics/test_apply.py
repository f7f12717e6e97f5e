"""engagement_daily_metrics refreshed from real Delta commits (appends, a MERGE update, a delete, a commit
whose changes only the change log holds): equal to a recomputation after every refresh, each change counted
once, the checkpoint stored in the metrics table's own commit; and the check's recomputation in Spark tasks
equal to grouping the rows read whole."""

from __future__ import annotations

import time
from datetime import UTC, date, datetime

import pyarrow as pa
from deltalake import write_deltalake

from engagement_platform.engagement.metrics.apply import (
    APP_ID,
    DAILY_METRICS,
    UNREAD_BOUND_S,
    Reflected,
    checkpoint_of,
    compare_with_recomputation,
    reflected_of,
    refresh_daily_metrics,
)
from engagement_platform.engagement.metrics.daily import METRICS_SCHEMA, daily_metrics
from engagement_platform.engagement.metrics.recompute import recomputed_metrics
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_NOTIFICATIONS
from engagement_platform.lake.change_log import LOGGED_BY, change_log_name, change_log_spec
from engagement_platform.lake.changes import START
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.notifications import notification_rows
from engagement_platform.spark.handoff import dealt

TABLE = ENGAGEMENT_ACTIVITY.name
D0 = date(2026, 3, 1)


def activity(items: list[tuple[str, str, date, str, int]], batch_id: int) -> pa.Table:
    now = datetime(2026, 3, 10, 12, tzinfo=UTC)
    return pa.Table.from_pylist(
        [
            dict(
                org_id=org,
                engagement_id=eid,
                engagement_date=day,
                activity_type=kind,
                lead_id=f"lead-{eid}",
                contact_id=None,
                account_id="acc",
                user_id="u",
                cadence_id=None,
                template_id=None,
                subject="s",
                call_outcome=None,
                duration_seconds=seconds,
                payload="{}",
                event_time=now,
                ingestion_time=now,
                source_partition=0,
                source_offset=i,
                batch_id=batch_id,
            )
            for i, (org, eid, day, kind, seconds) in enumerate(items)
        ],
        schema=ENGAGEMENT_ACTIVITY.schema,
    )


def notify(lake, app: str, batch_id: int, version: int | None = None) -> None:
    """The notification rows of the batch's commit (`version`, else the table's latest)."""
    version = lake.table(TABLE).version() if version is None else version
    lake.append(
        ENGAGEMENT_NOTIFICATIONS,
        notification_rows(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, version, app, batch_id),
        BatchTxn(app, batch_id),
    )


def read_whole(lake, version: int | None) -> pa.Table:
    """The slow, obviously correct recomputation: every row of the table at `version` grouped on this process."""
    if version is None:
        return METRICS_SCHEMA.empty_table()
    return daily_metrics(
        lake.table(TABLE, version).to_pyarrow_table(
            columns=["org_id", "engagement_date", "activity_type", "duration_seconds"]
        )
    )


def refreshed_and_equal(lake) -> int:
    refresh = refresh_daily_metrics(lake)
    compared = compare_with_recomputation(lake, refresh.reflected, read_whole(lake, refresh.activity_version))
    assert compared.keys_differing == 0, compared.sample
    assert refresh.activity_version == lake.table(TABLE).version()
    return compared.activities_stored


def test_metrics_follow_inserts_updates_and_deletes_exactly_once(lake):
    lake.append(
        ENGAGEMENT_ACTIVITY,
        activity([("o1", "a", D0, "call", 60), ("o1", "b", D0, "call", 30), ("o2", "c", D0, "meeting", 600)], 1),
        BatchTxn("ingest", 1),
    )
    notify(lake, "ingest", 1)
    assert refreshed_and_equal(lake) == 3
    first = checkpoint_of(lake)
    assert first != START and lake.committed_version(DAILY_METRICS.name, APP_ID) == first

    # an update that moves a row to another day and type (pre- and post-image), then a delete, then more inserts
    moved = activity([("o1", "a", D0.replace(day=2), "meeting", 45)], 2)
    (
        lake.merge(
            ENGAGEMENT_ACTIVITY, moved, "t.org_id = s.org_id AND t.engagement_id = s.engagement_id", BatchTxn("fix", 1)
        )
        .when_matched_update({c: f"s.{c}" for c in ("engagement_date", "activity_type", "duration_seconds")})
        .execute()
    )
    notify(lake, "fix", 1)
    lake.delete(ENGAGEMENT_ACTIVITY, "engagement_id = 'b'", BatchTxn("erase", 1))
    notify(lake, "erase", 1)
    lake.append(ENGAGEMENT_ACTIVITY, activity([("o2", "d", D0, "meeting", 5)], 3), BatchTxn("ingest", 3))
    notify(lake, "ingest", 3)
    assert refreshed_and_equal(lake) == 3  # a, c, d
    stored = {
        (r["org_id"], r["engagement_date"], r["activity_type"]): (r["activities"], r["duration_seconds"])
        for r in lake.read(DAILY_METRICS.name).to_pylist()
    }
    assert stored == {
        ("o1", D0.replace(day=2), "meeting"): (1, 45),
        ("o2", D0, "meeting"): (2, 605),
    }  # o1's day-1 calls are gone

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
    assert (
        compare_with_recomputation(lake, refresh.reflected, read_whole(lake, refresh.activity_version)).keys_differing
        == 0
    )


def test_a_version_notified_late_is_unread_until_its_notification_comes_and_then_counted_once(lake):
    """A batch commits version 4, crashes before its notification, and notifies it after version 5's (seen in a
    soak): the refresh between reflects up to version 5 except 4, and the check says it equals that."""
    lake.append(
        ENGAGEMENT_ACTIVITY,
        activity([("o1", "a", D0, "call", 60), ("o1", "b", D0, "call", 30)], 1),
        BatchTxn("ingest", 1),
    )
    notify(lake, "ingest", 1)
    lake.append(ENGAGEMENT_ACTIVITY, activity([("o1", "d", D0, "call", 10)], 2), BatchTxn("ingest", 2))
    notify(lake, "ingest", 2)
    lake.compact(TABLE)  # version 3: compaction changes no row and is never notified, so it is never unread
    lake.delete(
        ENGAGEMENT_ACTIVITY, "engagement_id = 'b'", BatchTxn("erase", 1)
    )  # version 4, its notification comes later
    lake.append(ENGAGEMENT_ACTIVITY, activity([("o2", "c", D0, "meeting", 600)], 3), BatchTxn("ingest", 3))  # version 5
    notify(lake, "ingest", 3)
    assert [c["operation"] for c in lake.history(TABLE, since=3)] == ["WRITE", "DELETE", "OPTIMIZE"]

    early = refresh_daily_metrics(lake)
    assert early.reflected == Reflected(5, (4,)) == reflected_of(lake)
    assert compare_with_recomputation(lake, early.reflected, read_whole(lake, 5)).keys_differing == 0
    assert compare_with_recomputation(lake, Reflected(5), read_whole(lake, 5)).keys_differing == 1, (
        "without the unread version it differs"
    )
    an_hour_on = (
        int(time.time() * 1000) + (UNREAD_BOUND_S + 60) * 1000
    )  # a notification that never comes fails the check
    lost = compare_with_recomputation(lake, early.reflected, read_whole(lake, 5), now_ms=an_hour_on)
    assert (
        lost.keys_differing == 0
        and not lost.passed
        and "version 4 changed rows but has not been notified" in lost.problem
    )

    def calls():
        return {(r["org_id"], r["activity_type"]): r["activities"] for r in lake.read(DAILY_METRICS.name).to_pylist()}

    assert calls() == {("o1", "call"): 3, ("o2", "meeting"): 1}, "b's delete is not in yet"

    notify(lake, "erase", 1, version=4)
    late = refresh_daily_metrics(lake)
    assert late.reflected == Reflected(5) and late.changed_rows == 1, (
        "only the late version is read, and the reflected version stays"
    )
    assert compare_with_recomputation(lake, late.reflected, read_whole(lake, 5)).keys_differing == 0
    assert calls() == {("o1", "call"): 2, ("o2", "meeting"): 1}


def test_a_commit_made_while_a_refresh_reads_the_log_is_read_from_its_own_version(tmp_path):
    """Another writer commits between the refresh's load of engagement_activity and its reading of the history
    (which versions are in the change log): every version must still be read from where its changes are."""
    lake = RacingLake(str(tmp_path / "lake"))
    lake.append(
        ENGAGEMENT_ACTIVITY,
        activity([("o1", "a", D0, "call", 60), ("o1", "b", D0, "call", 30)], 1),
        BatchTxn("ingest", 1),
    )
    notify(lake, "ingest", 1)
    assert refreshed_and_equal(lake) == 2
    # version 2: a rewrite whose commit names the change log (its change feed is file-level: a, b out; a in)
    rewritten = activity([("o1", "a", D0, "call", 60)], 2)
    log = change_log_spec(ENGAGEMENT_ACTIVITY)
    write_deltalake(
        lake.table(TABLE),
        rewritten,
        mode="overwrite",
        predicate="org_id = 'o1'",
        commit_properties=BatchTxn("rewrite", 1, {LOGGED_BY: change_log_name(TABLE)}).commit_properties(),
    )
    lake.append(
        log,
        activity([("o1", "b", D0, "call", 30)], 1)
        .append_column("_change_type", pa.array(["delete"]))
        .append_column("_commit_version", pa.array([2], pa.int64())),
        BatchTxn("rewrite", 1),
    )
    notify(lake, "rewrite", 1)
    lake.append(ENGAGEMENT_ACTIVITY, activity([("o2", "c", D0, "meeting", 5)], 3), BatchTxn("ingest", 3))  # version 3
    notify(lake, "ingest", 3)
    lake.racing = 2  # a commit right after the refresh's next loads of the table
    refresh = refresh_daily_metrics(lake)
    assert refresh.changed_rows == 2, "b's delete from the log and c's insert, not version 2's file-level feed"
    compared = compare_with_recomputation(lake, refresh.reflected, read_whole(lake, refresh.activity_version))
    assert compared.keys_differing == 0 and compared.activities_stored == 2, compared.sample


class RacingLake(DeltaLake):
    """Another writer appends to engagement_activity right after each of the next `racing` loads of it."""

    racing = 0

    def table(self, name, version=None):
        loaded = super().table(name, version)
        if name == TABLE and version is None and self.racing:
            self.racing -= 1
            DeltaLake(self.root).append(
                ENGAGEMENT_ACTIVITY,
                activity([("o9", f"race{self.racing}", D0, "email", 0)], 9),
                BatchTxn("racer", self.racing + 1),
            )
        return loaded


def test_files_are_dealt_to_tasks_once_each_and_no_task_is_empty():
    files = [(f"f{i}", f"o{i % 3}") for i in range(7)]
    for tasks in (1, 2, 4, 7, 50):
        shares = dealt(files, tasks)
        assert (
            len(shares) == min(tasks, 7)
            and all(shares)
            and sorted(f for share in shares for f in share) == sorted(files)
        )
    assert dealt([], 4) == [[]]


def test_spark_tasks_recompute_what_grouping_the_rows_read_whole_gives(spark, lake):
    assert recomputed_metrics(spark, lake, None).num_rows == 0
    for batch in range(1, 4):  # several files per org, over three orgs
        lake.append(
            ENGAGEMENT_ACTIVITY,
            activity(
                [
                    (f"o{i % 3}", f"e{batch}-{i}", D0.replace(day=1 + i % 4), ("call", "meeting")[i % 2], i)
                    for i in range(40)
                ],
                batch,
            ),
            BatchTxn("ingest", batch),
        )
    moved = activity([("o1", "e1-1", D0.replace(day=9), "email_sent", 7)], 9)
    (
        lake.merge(
            ENGAGEMENT_ACTIVITY, moved, "t.org_id = s.org_id AND t.engagement_id = s.engagement_id", BatchTxn("fix", 1)
        )
        .when_matched_update({c: f"s.{c}" for c in ("engagement_date", "activity_type", "duration_seconds")})
        .execute()
    )
    lake.delete(ENGAGEMENT_ACTIVITY, "engagement_id = 'e2-2'", BatchTxn("erase", 1))
    version = lake.table(TABLE).version()
    expected = read_whole(lake, version)
    assert expected.num_rows > 10 and expected.equals(recomputed_metrics(spark, lake, version))
    assert read_whole(lake, 0).equals(recomputed_metrics(spark, lake, 0)), "an older version reads that version's files"
