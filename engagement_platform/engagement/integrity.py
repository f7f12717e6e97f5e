"""Integrity measurements of the engagement lake (no Dagster): the numbers its asset checks report."""

from __future__ import annotations

import pyarrow.compute as pc

from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_NOTIFICATIONS
from engagement_platform.lake import notifications
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.notifications import NotificationAudit


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


def audit_notifications(
    lake: DeltaLake, table: str, table_version: int | None, app_name: str, batch_id: int
) -> NotificationAudit:
    """One batch's engagement_notifications rows against the change data feed of its commit of `table`."""
    return notifications.audit_notifications(
        lake, ENGAGEMENT_NOTIFICATIONS.name, table, table_version, app_name, batch_id
    )
