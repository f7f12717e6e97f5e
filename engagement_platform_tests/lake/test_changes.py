"""Incremental reads through the notification table (changes_since) and batch reads (read_org_dates)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_NOTIFICATIONS
from engagement_platform.lake.changes import START, changes_since, read_org_dates
from engagement_platform.lake.delta import BatchTxn, sql_literal
from engagement_platform.lake.notifications import change_counts, notification_rows, notifications_since

APP = "engagement.ingestion"
TABLE = ENGAGEMENT_ACTIVITY.name
D0 = date(2024, 5, 1)


def activity(items: list[tuple[str, str, date]], batch_id: int = 1) -> pa.Table:
    now = datetime(2024, 5, 10, 12, tzinfo=UTC)
    rows = [
        dict(
            org_id=org,
            engagement_id=eid,
            engagement_date=d,
            activity_type="call",
            lead_id=f"lead-{eid}",
            contact_id=None,
            account_id="acc-1",
            user_id="u-1",
            cadence_id=None,
            template_id=None,
            subject=f"s {eid}",
            call_outcome="connected",
            duration_seconds=60,
            payload="{}",
            event_time=now,
            ingestion_time=now,
            source_partition=0,
            source_offset=i,
            batch_id=batch_id,
        )
        for i, (org, eid, d) in enumerate(items)
    ]
    return pa.Table.from_pylist(rows, schema=ENGAGEMENT_ACTIVITY.schema)


def notify(lake, version: int, batch_id: int, app: str = APP) -> int | None:
    rows = notification_rows(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, version, app, batch_id)
    return lake.append(ENGAGEMENT_NOTIFICATIONS, rows, BatchTxn(app, batch_id))


def ingest(lake, items, batch_id: int) -> int:
    version = lake.append(ENGAGEMENT_ACTIVITY, activity(items, batch_id), BatchTxn(APP, batch_id))
    assert version is not None
    assert notify(lake, version, batch_id) is not None
    return version


def changed(cs) -> list[tuple[str, str, str]]:
    return sorted((r["org_id"], r["engagement_id"], r["_change_type"]) for r in cs.rows.to_pylist())


def test_nothing_before_any_notification(lake):
    cs = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, "org-a", START)
    assert cs.rows.num_rows == 0 and cs.checkpoint == START and cs.table_versions == []


def test_notification_rows_count_changes_per_org(lake):
    v = lake.append(
        ENGAGEMENT_ACTIVITY, activity([("org-a", "a1", D0), ("org-a", "a2", D0), ("org-b", "b1", D0)]), BatchTxn(APP, 1)
    )
    assert change_counts(lake, TABLE, v) == {
        "org-a": {"inserted": 2, "updated": 0, "deleted": 0},
        "org-b": {"inserted": 1, "updated": 0, "deleted": 0},
    }
    rows = notification_rows(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, v, APP, 1).to_pylist()
    assert [(r["org_id"], r["table_version"], r["inserted"], r["batch_id"], r["app_name"]) for r in rows] == [
        ("org-a", v, 2, 1, APP),
        ("org-b", v, 1, 1, APP),
    ]
    assert notify(lake, v, 1) is not None
    assert notify(lake, v, 1) is None  # a retried batch does not notify twice
    assert notifications_since(lake, ENGAGEMENT_NOTIFICATIONS, "org-a", -1, TABLE).num_rows == 1
    assert notifications_since(lake, ENGAGEMENT_NOTIFICATIONS, "org-a", v, TABLE).num_rows == 0


def test_changes_since_follows_inserts_deletes_and_checkpoints(lake):
    org, other = "org-a", "org-b"

    # Batch 1: both orgs.
    v1 = ingest(lake, [(org, "a1", D0), (org, "a2", D0 + timedelta(days=1)), (other, "b1", D0)], 1)
    cs1 = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, START)
    assert changed(cs1) == [(org, "a1", "insert"), (org, "a2", "insert")]
    assert cs1.table_versions == [v1]
    assert cs1.checkpoint == lake.table(ENGAGEMENT_NOTIFICATIONS.name).version()
    assert set(cs1.rows["_commit_version"].to_pylist()) == {v1}
    assert cs1.rows.schema.field("engagement_id").type == pa.string()
    # Full rows, not just keys.
    assert {r["engagement_id"]: r["engagement_date"] for r in cs1.rows.to_pylist()} == {
        "a1": D0,
        "a2": D0 + timedelta(days=1),
    }

    # Nothing new since the checkpoint.
    again = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, cs1.checkpoint)
    assert again.rows.num_rows == 0 and again.checkpoint == cs1.checkpoint

    # Batch 2: only the new rows come back.
    v2 = ingest(lake, [(org, "a3", D0), (other, "b2", D0)], 2)
    cs2 = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, cs1.checkpoint)
    assert changed(cs2) == [(org, "a3", "insert")]
    assert cs2.table_versions == [v2]
    assert cs2.checkpoint > cs1.checkpoint

    # A delete of one row of the org, then its notification.
    deleted = lake.delete(
        ENGAGEMENT_ACTIVITY, f"org_id = {sql_literal(org)} AND engagement_id = 'a1'", BatchTxn("engagement.deletion", 1)
    )
    assert deleted["num_deleted_rows"] == 1
    v3 = deleted["version"]
    assert notify(lake, v3, 1, app="engagement.deletion") is not None
    note = notifications_since(lake, ENGAGEMENT_NOTIFICATIONS, org, v2, TABLE).to_pylist()
    assert [(n["table_version"], n["deleted"], n["inserted"]) for n in note] == [(v3, 1, 0)]
    cs3 = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, cs2.checkpoint)
    assert changed(cs3) == [(org, "a1", "delete")]
    assert cs3.table_versions == [v3]

    # Read from the start: everything of the org, in commit order, never the other org.
    full = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, START)
    assert full.table_versions == [v1, v2, v3]
    assert changed(full) == [(org, "a1", "delete"), (org, "a1", "insert"), (org, "a2", "insert"), (org, "a3", "insert")]
    versions = full.rows["_commit_version"].to_pylist()
    assert versions == sorted(versions)
    assert full.checkpoint == cs3.checkpoint

    # The other org sees only its own rows.
    theirs = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, other, START)
    assert changed(theirs) == [(other, "b1", "insert"), (other, "b2", "insert")]
    assert theirs.table_versions == [v1, v2]  # the delete did not touch org-b

    # Latest checkpoint: nothing.
    last = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, cs3.checkpoint)
    assert last.rows.num_rows == 0 and last.checkpoint == cs3.checkpoint and last.table_versions == []


def test_update_appears_as_postimage_only(lake):
    org = "org-a"
    ingest(lake, [(org, "a1", D0), (org, "a2", D0)], 1)
    cs1 = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, START)
    src = activity([(org, "a1", D0 + timedelta(days=3))], batch_id=2)
    lake.merge(
        ENGAGEMENT_ACTIVITY, src, "t.org_id = s.org_id AND t.engagement_id = s.engagement_id", BatchTxn("fix", 1)
    ).when_matched_update({"engagement_date": "s.engagement_date"}).execute()
    v = lake.table(TABLE).version()
    assert change_counts(lake, TABLE, v) == {org: {"inserted": 0, "updated": 1, "deleted": 0}}
    notify(lake, v, 1, app="fix")
    cs2 = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, cs1.checkpoint)
    assert changed(cs2) == [(org, "a1", "update_postimage")]
    assert cs2.rows.to_pylist()[0]["engagement_date"] == D0 + timedelta(days=3)


def test_unnotified_commits_and_other_orgs_batches_are_not_read(lake):
    org, other = "org-a", "org-b"
    ingest(lake, [(org, "a1", D0)], 1)
    cs1 = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, START)
    # A batch with only the other org: org-a's checkpoint advances, no rows.
    ingest(lake, [(other, "b1", D0)], 2)
    cs2 = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, cs1.checkpoint)
    assert cs2.rows.num_rows == 0
    assert cs2.table_versions == []
    assert cs2.checkpoint > cs1.checkpoint
    # Data committed without a notification yet (the writer has not notified): not visible.
    lake.append(ENGAGEMENT_ACTIVITY, activity([(org, "a2", D0)], 3), BatchTxn(APP, 3))
    cs3 = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, cs2.checkpoint)
    assert cs3.rows.num_rows == 0
    # Once notified, it is.
    notify(lake, lake.find_batch_commit(TABLE, APP, 3), 3)
    cs4 = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, cs3.checkpoint)
    assert changed(cs4) == [(org, "a2", "insert")]


def test_changes_since_ignores_other_tables_notifications(lake):
    org = "org-a"
    v1 = ingest(lake, [(org, "a1", D0)], 1)
    foreign = notification_rows(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, v1, "other.app", 1)
    foreign = foreign.set_column(
        foreign.schema.get_field_index("table_name"), "table_name", pa.array(["other_table"] * foreign.num_rows)
    )
    lake.append(ENGAGEMENT_NOTIFICATIONS, foreign, BatchTxn("other.app", 1))
    cs = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, START)
    assert changed(cs) == [(org, "a1", "insert")]  # once, not duplicated by the foreign row
    assert cs.table_versions == [v1]


def test_read_org_dates(lake):
    org, other = "org-a", "org-b"
    items = [(org, f"a{i}", D0 + timedelta(days=i)) for i in range(6)] + [
        (other, f"b{i}", D0 + timedelta(days=i)) for i in range(6)
    ]
    # Two batches so the range spans several files.
    ingest(lake, items[:3] + items[6:9], 1)
    ingest(lake, items[3:6] + items[9:], 2)

    out = read_org_dates(lake, TABLE, org, D0 + timedelta(days=1), D0 + timedelta(days=3))
    assert sorted(out["engagement_id"].to_pylist()) == ["a1", "a2", "a3"]  # inclusive both ends
    assert set(out["org_id"].to_pylist()) == {org}
    assert pc.min(out["engagement_date"]).as_py() >= D0 + timedelta(days=1)
    assert pc.max(out["engagement_date"]).as_py() <= D0 + timedelta(days=3)

    assert sorted(read_org_dates(lake, TABLE, org, start=D0 + timedelta(days=4))["engagement_id"].to_pylist()) == [
        "a4",
        "a5",
    ]
    assert sorted(read_org_dates(lake, TABLE, other, end=D0)["engagement_id"].to_pylist()) == ["b0"]
    assert read_org_dates(lake, TABLE, org).num_rows == 6
    assert read_org_dates(lake, TABLE, org, D0 + timedelta(days=10), D0 + timedelta(days=20)).num_rows == 0
    assert read_org_dates(lake, TABLE, "org-none").num_rows == 0


def test_interleaved_writers_notifying_out_of_order_are_not_skipped(lake):
    org = "org-a"
    lake.ensure(ENGAGEMENT_NOTIFICATIONS)
    va = lake.append(ENGAGEMENT_ACTIVITY, activity([(org, "w1", D0)], 1), BatchTxn("writer.one", 1))
    vb = lake.append(ENGAGEMENT_ACTIVITY, activity([(org, "w2", D0)], 1), BatchTxn("writer.two", 1))
    assert va < vb
    # Writer two notifies first; the consumer reads in between.
    notify(lake, vb, 1, app="writer.two")
    cs1 = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, START)
    assert changed(cs1) == [(org, "w2", "insert")]
    assert cs1.table_versions == [vb]
    # Writer one's notification comes later with a lower table version: still delivered.
    notify(lake, va, 1, app="writer.one")
    cs2 = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, TABLE, org, cs1.checkpoint)
    assert changed(cs2) == [(org, "w1", "insert")]
    assert cs2.table_versions == [va]
