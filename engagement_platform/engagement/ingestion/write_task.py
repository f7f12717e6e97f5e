"""The ingestion batch's Spark task: each task writes its valid rows into engagement_activity's folder as
Parquet files (one per org it holds, with Delta statistics) and hands back the file actions, the keys the
driver's duplicate checks need and its rejected rows. The valid rows never travel to the driver; the
driver commits the files (or, rarely, first rewrites the few holding a duplicate it found)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.ingest.errors import ERRORS, RAW, ROW_ID, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.sources import INPUT
from engagement_platform.lake.file_writes import write_files
from engagement_platform.spark.handoff import handoff

FILES, KEYS, REJECTED = "files", "keys", "rejected"  # the kinds of handoff rows a task returns
KEY_COLUMNS = ["org_id", "engagement_id", SOURCE_PARTITION, SOURCE_OFFSET]


def activity_rows(good: pa.Table, batch_id: int, ingested_at: datetime) -> pa.Table:
    """Valid records as engagement_activity rows: the framework's columns dropped, the source position
    renamed, the ingestion time and batch id added."""
    n = good.num_rows
    return (
        good.drop_columns([c for c in (ERRORS, RAW, INPUT, ROW_ID) if c in good.column_names])
        .rename_columns({SOURCE_PARTITION: "source_partition", SOURCE_OFFSET: "source_offset"})
        .append_column("ingestion_time", pa.array([ingested_at] * n, pa.timestamp("us", tz="UTC")))
        .append_column("batch_id", pa.array([batch_id] * n, pa.int64()))
    )


def write_task(table_uri: str, tag: str, batch_id: int, ingested_at: datetime, write: bool,
               storage_options: Mapping[str, str] | None = None) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function over a validated slice. With `write` False (a re-run whose data commit is
    already there) it writes nothing and only hands back keys and rejected rows."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = list(batches)
        if not batches:
            return
        rows = pa.Table.from_batches(batches)
        n_errors = pc.list_value_length(rows[ERRORS])
        good, bad = rows.filter(pc.equal(n_errors, 0)), rows.filter(pc.greater(n_errors, 0))
        files = write_files(table_uri, ENGAGEMENT_ACTIVITY, activity_rows(good, batch_id, ingested_at), tag, storage_options) if write else []
        yield from handoff(FILES, pa.table({"file": pa.array([f.to_json() for f in files], pa.string())}))
        yield from handoff(KEYS, good.select(KEY_COLUMNS))
        yield from handoff(REJECTED, bad)

    return run
