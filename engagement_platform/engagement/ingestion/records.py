"""Engagement records through the composable ingest framework, plus the batch-level rules.

Parsing, types, required fields and the activity type enum are declared in pipeline.yaml (next to
this module) and run by the framework (engagement_platform.ingest), so the stream's error table is a
quarantine table in the one error schema. What the framework cannot see row by row, an engagement_id
repeated within the batch or already in the table, is marked here on the driver, in the same schema.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.ingest.config import PipelineConfig, load_kafka_pipeline
from engagement_platform.ingest.errors import ERRORS, SOURCE_OFFSET, SOURCE_PARTITION, VALIDATE

PIPELINE_FILE = Path(__file__).with_name("pipeline.yaml")
UNIQUE_IN_BATCH = "unique_in_batch"
UNIQUE_IN_TABLE = "unique_in_table"
KEY_SEPARATOR = "\x1f"  # joins org_id and engagement_id into one comparable key (ids hold no control characters)


def ingestion_pipeline(topic: str) -> PipelineConfig:
    return load_kafka_pipeline(PIPELINE_FILE, topic)


def mark_duplicates_in_batch(validated: pa.Table) -> tuple[pa.Table, list[int]]:
    """Give later copies of an (org_id, engagement_id) a duplicate_in_batch error; return their rows.

    Among valid rows the first occurrence (lowest partition, offset) wins. Runs on the driver over
    the Arrow result (a hash group-by on two columns) instead of a sort-based window shuffle in Spark.
    The flagged rows come back from Spark without raw bytes: the caller fetches those.
    """
    valid = pc.equal(pc.list_value_length(validated[ERRORS]), 0)
    keys = pa.table(
        {
            "org_id": validated["org_id"],
            "engagement_id": validated["engagement_id"],
            "p": validated[SOURCE_PARTITION],
            "o": validated[SOURCE_OFFSET],
            "i": pa.array(range(validated.num_rows), pa.int64()),
        }
    ).filter(valid)
    firsts = (
        keys.sort_by([("p", "ascending"), ("o", "ascending")])
        .group_by(["org_id", "engagement_id"], use_threads=False)
        .aggregate([("i", "first")])
    )
    if firsts.num_rows == keys.num_rows:
        return validated, []
    duplicates = sorted(pc.filter(keys["i"], pc.invert(pc.is_in(keys["i"], firsts["i_first"]))).to_pylist())
    return _flag(
        validated,
        duplicates,
        UNIQUE_IN_BATCH,
        "duplicate_in_batch",
        lambda org, eid: f"engagement_id '{eid}' already appears earlier in this batch",
    ), duplicates


def _flag(validated: pa.Table, rows: list[int], plugin: str, code: str, message) -> pa.Table:
    """`validated` with `rows`' errors replaced by one engagement_id error; message(org_id, engagement_id)."""
    errors = validated[ERRORS].to_pylist()
    picked = pa.array(rows, pa.int64())
    for i, org, eid in zip(
        rows, validated["org_id"].take(picked).to_pylist(), validated["engagement_id"].take(picked).to_pylist()
    ):
        errors[i] = [
            {
                "stage": VALIDATE,
                "plugin": plugin,
                "column_name": "engagement_id",
                "error_code": code,
                "message": message(org, eid),
                "value": eid,
            }
        ]
    column = validated.schema.get_field_index(ERRORS)
    return validated.set_column(column, ERRORS, pa.array(errors, validated.schema.field(ERRORS).type))


def mark_already_in_table(validated: pa.Table, existing: pa.Table) -> tuple[pa.Table, list[int]]:
    """Give valid rows whose (org_id, engagement_id) `existing` holds (org_id, engagement_id, batch_id: the
    table's rows with those keys) an already_in_table error; return their rows.

    A producer that re-sends an activity at a new offset (a retry, a replay, a restarted generator) would
    otherwise append a second row with the key: the table keeps one row per engagement, as within a batch
    the first copy wins and the later one goes to quarantine with its raw bytes."""
    if existing.num_rows == 0:
        return validated, []
    sep = KEY_SEPARATOR
    valid = pc.equal(pc.list_value_length(validated[ERRORS]), 0)
    keys = pc.binary_join_element_wise(validated["org_id"], validated["engagement_id"], sep)
    held = pc.binary_join_element_wise(existing["org_id"], existing["engagement_id"], sep)
    hit = pc.and_(valid, pc.fill_null(pc.is_in(keys, value_set=held), False))
    flagged = pc.indices_nonzero(hit).to_pylist()
    if not flagged:
        return validated, []
    first_batch = dict(zip(held.to_pylist(), existing["batch_id"].to_pylist()))
    return _flag(
        validated,
        flagged,
        UNIQUE_IN_TABLE,
        "already_in_table",
        lambda org, eid: (
            f"engagement_id '{eid}' of org {org} is already in engagement_activity (written by batch {first_batch[org + sep + eid]})"
        ),
    ), flagged
