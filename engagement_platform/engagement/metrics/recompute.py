"""The check's full recomputation of the daily metrics in Spark tasks, so it grows with the cluster, not the driver.

The driver lists engagement_activity's data files at the version the metrics reflect (the Delta log: paths and
partition values, no rows) and deals them out to tasks. Each task reads its files' three measured columns with
pyarrow (local disk or an object store, lake/file_writes.py), puts back the org from the partition value, and
groups them (daily.py's `daily_metrics`, the same rule the incremental refresh must agree with). Only each
task's aggregates come back, one row per (org, day, activity type), and the driver sums those: its work grows
with the number of keys, never with the table's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import pyarrow as pa
from pyspark.sql import SparkSession

from engagement_platform.engagement.metrics.daily import METRICS_SCHEMA, add_deltas, daily_metrics
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.file_writes import filesystem, read_parquet
from engagement_platform.spark.handoff import HANDOFF_SCHEMA, collect_handoff, dealt, handoff

MEASURED = ["engagement_date", "activity_type", "duration_seconds"]  # org_id is the partition value, not in the files
PARTIAL = "partial_metrics"


def data_files(lake: DeltaLake, version: int) -> list[tuple[str, str]]:
    """(path relative to the table, org) of every data file of engagement_activity at `version`."""
    actions = pa.table(lake.table(ENGAGEMENT_ACTIVITY.name, version).get_add_actions(flatten=True))
    return list(zip(actions["path"].to_pylist(), actions["partition.org_id"].to_pylist()))


def recompute_task(
    table_uri: str, files_by_task: list[list[tuple[str, str]]], storage_options: Mapping[str, str] | None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function over spark.range(len(files_by_task)): task i aggregates files_by_task[i]."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fs, root = filesystem(table_uri, storage_options)
        for batch in batches:
            for index in batch.column("id").to_pylist():
                per_file = [METRICS_SCHEMA.empty_table()]
                for path, org in files_by_task[index]:
                    rows = read_parquet(fs, f"{root}/{path}", columns=MEASURED)
                    rows = rows.append_column("org_id", pa.array([org] * rows.num_rows, pa.string()))
                    per_file.append(daily_metrics(rows))  # one row per key of the file: the rows are not kept
                yield from handoff(PARTIAL, add_deltas(METRICS_SCHEMA.empty_table(), pa.concat_tables(per_file)))

    return run


def recomputed_metrics(spark: SparkSession, lake: DeltaLake, version: int | None) -> pa.Table:
    """`daily_metrics` of engagement_activity at `version`, computed by Spark tasks (empty before any activity)."""
    files = data_files(lake, version) if version is not None else []
    if not files:
        return METRICS_SCHEMA.empty_table()
    shares = dealt(files, int(spark.conf.get("spark.sql.shuffle.partitions")))
    task = recompute_task(lake.uri(ENGAGEMENT_ACTIVITY.name), shares, lake.storage_options)
    handed = collect_handoff(spark.range(len(shares), numPartitions=len(shares)).mapInArrow(task, HANDOFF_SCHEMA))
    return add_deltas(METRICS_SCHEMA.empty_table(), handed.get(PARTIAL, METRICS_SCHEMA.empty_table()))
