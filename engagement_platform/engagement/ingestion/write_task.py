"""The ingestion batch's Spark task: each task writes its valid rows into engagement_activity's folder as
Parquet files (one per org it holds, with Delta statistics) and hands back the file actions, the keys the
driver's duplicate checks need and its rejected rows. The valid rows never travel to the driver; the
driver commits the files (or, rarely, first rewrites the few holding a duplicate it found). Records naming
an erased subject (the suppression list, lake/suppression.py) are dropped here, only their hashes handed back."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.retention.requests import SUBJECT_FIELDS
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.ingest.errors import ERRORS, RAW, ROW_ID, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.sources import INPUT
from engagement_platform.lake.file_writes import write_files
from engagement_platform.lake.suppression import Suppressed
from engagement_platform.lake.suppression_tables import hits_table
from engagement_platform.spark.handoff import handoff

FILES, KEYS, REJECTED, SUPPRESSED = (
    "files",
    "keys",
    "rejected",
    "suppressed",
)  # the kinds of handoff rows a task returns
KEY_COLUMNS = ["org_id", "engagement_id", SOURCE_PARTITION, SOURCE_OFFSET]


def activity_rows(good: pa.Table, batch_id: int, ingested_at: datetime) -> pa.Table:
    """Valid records as engagement_activity rows: the framework's columns dropped, the source position
    renamed, the ingestion time and batch id added."""
    n = good.num_rows
    return (
        good.drop_columns([c for c in (ERRORS, RAW, INPUT, ROW_ID) if c in good.column_names])
        .rename_columns({SOURCE_PARTITION: "source_partition", SOURCE_OFFSET: "source_offset"})
        .append_column("ingestion_time", pa.repeat(pa.scalar(ingested_at, pa.timestamp("us", tz="UTC")), n))
        .append_column("batch_id", pa.repeat(pa.scalar(batch_id, pa.int64()), n))
    )


def drop_suppressed(
    good: pa.Table, bad: pa.Table, suppressed: Suppressed
) -> tuple[pa.Table, pa.Table, list[tuple[str, str]]]:
    """(good, bad) without the records that name a suppressed subject of their org: a valid record by its
    lead_id / contact_id, a rejected one by its raw content (any org's subject when it has no org). Returns
    the (org, subject hash) of each dropped record too. Rows of orgs without suppressed subjects are not hashed."""
    hits: list[tuple[str, str]] = []
    if not suppressed:
        return good, bad, hits
    keep_good = []
    for org, *ids in zip(*(good[c].to_pylist() for c in ("org_id", *SUBJECT_FIELDS))):
        found = suppressed.hit(org, ids)
        keep_good.append(found is None)
        if found:
            hits.append((org, found))
    keep_bad = []
    orgs = bad["org_id"].to_pylist() if "org_id" in bad.column_names else [None] * bad.num_rows
    texts = [bad[c].to_pylist() for c in (RAW, INPUT) if c in bad.column_names]
    for i, org in enumerate(orgs):
        found = suppressed.content_hit(org, [t[i] for t in texts])
        keep_bad.append(found is None)
        if found:
            hits.append(found)
    return good.filter(pa.array(keep_good, pa.bool_())), bad.filter(pa.array(keep_bad, pa.bool_())), hits


def write_task(
    table_uri: str,
    tag: str,
    batch_id: int,
    ingested_at: datetime,
    write: bool,
    storage_options: Mapping[str, str] | None = None,
    suppressed: Suppressed | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function over a validated slice. With `write` False (a re-run whose data commit is
    already there) it writes nothing and only hands back keys and rejected rows. Records naming a
    `suppressed` (erased) subject are dropped before anything is written or handed back but their hashes."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = list(batches)
        if not batches:
            return
        rows = pa.Table.from_batches(batches)
        n_errors = pc.list_value_length(rows[ERRORS])
        good, bad = rows.filter(pc.equal(n_errors, 0)), rows.filter(pc.greater(n_errors, 0))
        good, bad, hits = drop_suppressed(good, bad, suppressed or Suppressed(b""))
        files = (
            write_files(
                table_uri, ENGAGEMENT_ACTIVITY, activity_rows(good, batch_id, ingested_at), tag, storage_options
            )
            if write
            else []
        )
        yield from handoff(FILES, pa.table({"file": pa.array([f.to_json() for f in files], pa.string())}))
        yield from handoff(KEYS, good.select(KEY_COLUMNS))
        yield from handoff(REJECTED, bad)
        yield from handoff(SUPPRESSED, hits_table(hits))

    return run
