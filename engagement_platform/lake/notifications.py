"""Notification rows: per org, what one batch's commit changed in a table.

Counts come from what that exact commit version changed: its rows in the table's change log when the
version is logged (lake/change_log.py), else its change data feed. So they are the same when a retried
batch writes them later, and the audit (`audit_notifications`, what the notifications_match_changes
check reports) recomputes them independently.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa

from engagement_platform.lake.change_log import CHANGE_TYPE, change_log_name, logged_changes, logged_versions
from engagement_platform.lake.delta import DeltaLake, TableSpec

CHANGE_COLUMNS = {"insert": "inserted", "update_postimage": "updated", "delete": "deleted"}


def change_counts(lake: DeltaLake, table: str, version: int) -> dict[str, dict[str, int]]:
    """org_id -> {inserted, updated, deleted} for one commit: from the change log when it logged the version
    (the commit's change data feed is file-level then), else from the change data feed."""
    if logged_versions(lake, table, version, version):
        changes = logged_changes(lake, change_log_name(table), [version])
    else:
        changes = lake.changes(table, version, version)
    grouped = changes.select(["org_id", CHANGE_TYPE]).group_by(["org_id", CHANGE_TYPE]).aggregate([([], "count_all")])
    counts: dict[str, dict[str, int]] = {}
    for row in grouped.to_pylist():
        kind = CHANGE_COLUMNS.get(row[CHANGE_TYPE])
        if kind:
            counts.setdefault(row["org_id"], {"inserted": 0, "updated": 0, "deleted": 0})[kind] += row["count_all"]
    return counts


def inserted_counts(rows: pa.Table) -> dict[str, dict[str, int]]:
    """The counts an append commit of `rows` produces (equal to its change data feed, cheaper)."""
    grouped = rows.group_by("org_id").aggregate([([], "count_all")]).to_pylist()
    return {r["org_id"]: {"inserted": r["count_all"], "updated": 0, "deleted": 0} for r in grouped}


def notification_rows(
    lake: DeltaLake,
    spec: TableSpec,
    table: str,
    version: int,
    app_name: str,
    batch_id: int,
    at: datetime | None = None,
    counts: dict[str, dict[str, int]] | None = None,
) -> pa.Table:
    """Rows for one commit; `counts` defaults to the commit's changes (change_counts)."""
    at = at or datetime.now(UTC)
    if counts is None:
        counts = change_counts(lake, table, version)
    rows = [
        dict(
            org_id=org,
            ingestion_hour=at.strftime("%Y-%m-%dT%H"),
            table_name=table,
            table_version=version,
            last_modified_time=at,
            app_name=app_name,
            batch_id=batch_id,
            **c,
        )
        for org, c in sorted(counts.items())
    ]
    return pa.Table.from_pylist(rows, schema=spec.schema)


def notifications_since(lake: DeltaLake, spec: TableSpec, org_id: str, after_version: int, table: str) -> pa.Table:
    """Notification rows of one org and table whose table_version is after `after_version`. For looking up, not
    for following: a batch can notify its version after a later version's notification (killed in between), so a
    reader that keeps the table version it reached would skip it. Follow the notification table's own version
    instead (changes_since)."""
    if not lake.exists(spec.name):
        return spec.schema.empty_table()
    rows = lake.read(
        spec.name, filters=[("org_id", "=", org_id), ("table_name", "=", table), ("table_version", ">", after_version)]
    )
    return rows.sort_by("table_version")


@dataclass(frozen=True)
class NotificationAudit:
    orgs_changed: int
    orgs_mismatched: int
    rows_changed: int
    rows_notified: int


def audit_notifications(
    lake: DeltaLake, notifications: str, table: str, table_version: int | None, app_name: str, batch_id: int
) -> NotificationAudit:
    """Compare one batch's rows in the notification table `notifications` with the changes (change_counts) of
    its commit of `table`; `table_version` None (the batch committed nothing to `table`) expects no changes."""
    expected = change_counts(lake, table, table_version) if table_version is not None else {}
    rows = (
        lake.read(
            notifications,
            filters=[("table_name", "=", table), ("app_name", "=", app_name), ("batch_id", "=", batch_id)],
        ).to_pylist()
        if lake.exists(notifications)
        else []
    )
    notified = {r["org_id"]: {k: r[k] for k in ("inserted", "updated", "deleted")} for r in rows}
    orgs = set(expected) | set(notified)
    mismatched = sum(1 for org in orgs if expected.get(org) != notified.get(org)) + (len(rows) - len(notified))
    return NotificationAudit(
        orgs_changed=len(expected),
        orgs_mismatched=mismatched,
        rows_changed=sum(sum(c.values()) for c in expected.values()),
        rows_notified=sum(r["inserted"] + r["updated"] + r["deleted"] for r in rows),
    )
