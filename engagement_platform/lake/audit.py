"""Read-back counts of one committed batch (no Dagster): what the conservation checks compare with the
records the batch read. They come from the tables, not from the run's own counts, so a commit that lost
or doubled rows shows up."""

from __future__ import annotations

import pyarrow.compute as pc

from engagement_platform.lake.delta import DeltaLake


def rows_of_batch(lake: DeltaLake, table: str, batch_id: int) -> int:
    """Rows of `table` whose batch_id is `batch_id` (0 if the table does not exist yet)."""
    if not lake.exists(table):
        return 0
    return lake.read(table, filters=[("batch_id", "=", batch_id)], columns=["batch_id"]).num_rows


def quarantined_records(lake: DeltaLake, table: str, batch_id: int, pipeline: str | None = None) -> int:
    """Distinct records (not error rows: a record has one row per error) one batch quarantined in `table`,
    optionally only those of `pipeline` (a quarantine table shared by several writers)."""
    if not lake.exists(table):
        return 0
    filters = [("batch_id", "=", batch_id)] + ([("pipeline", "=", pipeline)] if pipeline is not None else [])
    rows = lake.read(table, filters=filters, columns=["row_id"])
    return pc.count_distinct(rows["row_id"]).as_py() if rows.num_rows else 0
