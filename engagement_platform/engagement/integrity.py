"""Integrity measurements of the engagement lake (no Dagster): the numbers the asset checks report."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.compute as pc

from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_NOTIFICATIONS, QUARANTINE_ENGAGEMENT_INGESTION
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.notifications import change_counts


def key_audit(lake: DeltaLake, org_ids: list[str] | None = None, batch_id: int | None = None) -> tuple[int, int]:
    """(rows beyond the first per (org_id, engagement_id), rows of `batch_id`) within the given orgs
    (all if None), from one read of the key columns."""
    filters = [("org_id", "in", org_ids)] if org_ids else None
    keys = lake.read(ENGAGEMENT_ACTIVITY.name, filters=filters, columns=["org_id", "engagement_id", "batch_id"])
    duplicates = keys.num_rows - keys.group_by(["org_id", "engagement_id"]).aggregate([]).num_rows
    in_batch = 0 if batch_id is None else (pc.sum(pc.equal(keys["batch_id"], batch_id)).as_py() or 0)
    return duplicates, in_batch


def duplicate_engagement_ids(lake: DeltaLake, org_ids: list[str] | None = None) -> int:
    return key_audit(lake, org_ids)[0]


@dataclass(frozen=True)
class NotificationAudit:
    orgs_changed: int
    orgs_mismatched: int
    rows_changed: int
    rows_notified: int


def audit_notifications(lake: DeltaLake, table: str, table_version: int, app_name: str, batch_id: int) -> NotificationAudit:
    """Compare one batch's notification rows with the change data feed of its commit."""
    expected = change_counts(lake, table, table_version)
    rows = lake.read(
        ENGAGEMENT_NOTIFICATIONS.name,
        filters=[("table_name", "=", table), ("app_name", "=", app_name), ("batch_id", "=", batch_id)],
    ).to_pylist()
    notified = {r["org_id"]: {k: r[k] for k in ("inserted", "updated", "deleted")} for r in rows}
    orgs = set(expected) | set(notified)
    mismatched = sum(1 for org in orgs if expected.get(org) != notified.get(org)) + (len(rows) - len(notified))
    return NotificationAudit(
        orgs_changed=len(expected),
        orgs_mismatched=mismatched,
        rows_changed=sum(sum(c.values()) for c in expected.values()),
        rows_notified=sum(r["inserted"] + r["updated"] + r["deleted"] for r in rows),
    )


def quarantined_records(lake: DeltaLake, pipeline: str, batch_id: int) -> int:
    """Distinct records (not error rows) quarantined by one batch."""
    rows = lake.read(
        QUARANTINE_ENGAGEMENT_INGESTION.name,
        filters=[("pipeline", "=", pipeline), ("batch_id", "=", batch_id)],
        columns=["row_id"],
    )
    return pc.count_distinct(rows["row_id"]).as_py()
