"""The notification step every writer of a data table ends its batch with: one row per org saying what
the batch's commit of the table changed (lake/notifications.py), committed with the txn like any table.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import pyarrow as pa

from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec
from engagement_platform.lake.notifications import inserted_counts, notification_rows
from engagement_platform.streams.batch import CommitStep, Outcomes

if TYPE_CHECKING:
    from engagement_platform.streams.planning import BatchPlan


def notification_step(
    lake: DeltaLake,
    notifications: TableSpec,
    table: str,
    app_id: str,
    plan: BatchPlan,
    at: datetime,
    appended: pa.Table | None = None,
    appended_counts: dict[str, dict[str, int]] | None = None,
) -> CommitStep:
    """Commit step of `notifications` for the batch's commit of `table` (an earlier step of the same batch).

    Counts come from `appended`, the rows this attempt appended to `table` (an append's change feed holds
    exactly them), or `appended_counts` (org -> counts, when the rows never reached this process), or,
    when both are None, from the commit's change data feed. When the step of `table` committed
    nothing in this attempt, an earlier attempt may have: that commit is found by its txn and counted from
    its change feed; with no commit at all (nothing to change) the step commits no rows, only its txn."""

    def commit(txn: BatchTxn, done: Outcomes) -> int | None:
        version = done.get(table)
        counts = None
        if version is not None:
            counts = inserted_counts(appended) if appended is not None else appended_counts
        if version is None:
            version = lake.find_batch_commit(table, app_id, plan.batch_id)
        if version is None:
            rows = notifications.schema.empty_table()
        else:
            rows = notification_rows(lake, notifications, table, version, app_id, plan.batch_id, at, counts)
        return lake.append(notifications, rows, txn)

    return CommitStep(notifications.name, commit)
