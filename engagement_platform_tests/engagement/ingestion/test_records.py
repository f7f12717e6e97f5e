"""Engagement records validated by the ingest framework (ingestion_pipeline.yaml) on real Spark."""

import json

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from engagement_platform.engagement.ingestion.records import (
    ingestion_pipeline,
    mark_already_in_table,
    mark_duplicates_in_batch,
)
from engagement_platform.ingest.errors import ERRORS, RAW, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import Pipeline
from engagement_platform.ingest.sources import KAFKA_PARTITION_SHIFT, parse_text
from engagement_platform_tests.support.activities import BAD_RECORDS, EXPECTED_CODES

GOOD = {
    "engagement_id": "e1",
    "org_id": "00D1",
    "activity_type": "call",
    "event_time": "2026-03-04T05:06:07Z",
    "duration_seconds": 61,
    "call_outcome": "connected",
    "payload": {"step": 2},
}


def validate_rows(spark, rows: list[tuple[int, int, bytes | None]], max_record_bytes: int | None = None):
    config = ingestion_pipeline("t")
    if max_record_bytes:
        config = config.model_copy(
            update={"source": config.source.model_copy(update={"max_record_bytes": max_record_bytes})}
        )
    df = spark.createDataFrame(rows, "p int, o long, v binary").select(
        (F.shiftleft(F.col("p").cast("long"), KAFKA_PARTITION_SHIFT) + F.col("o")).alias("_row_id"),
        F.col("p").alias(SOURCE_PARTITION),
        F.col("o").alias(SOURCE_OFFSET),
        F.col("v").alias(RAW),
    )
    return Pipeline.from_config(config).transform(parse_text(df, config.source)).toArrow()


def validate(spark, values, max_record_bytes=None):
    return validate_rows(spark, [(0, i, v) for i, v in enumerate(values)], max_record_bytes).to_pylist()


def test_good_record_is_typed_and_has_no_errors(spark):
    (row,) = validate(spark, [json.dumps(GOOD).encode()])
    assert row[ERRORS] == []
    assert row[RAW] is None  # raw bytes only travel back for bad records
    assert str(row["engagement_date"]) == "2026-03-04"
    assert row["event_time"].isoformat().startswith("2026-03-04T05:06:07")
    assert row["duration_seconds"] == 61
    assert json.loads(row["payload"]) == {"step": 2}


def test_engagement_date_defaults_to_the_utc_day_of_event_time(spark):
    late = {**GOOD, "event_time": "2026-03-04T23:30:00-05:00"}
    given = {**GOOD, "engagement_date": "2026-01-01"}
    rows = validate(spark, [json.dumps(late).encode(), json.dumps(given).encode()])
    assert [str(r["engagement_date"]) for r in rows] == ["2026-03-05", "2026-01-01"]


@pytest.mark.parametrize("kind", sorted(BAD_RECORDS))
def test_each_kind_of_bad_record_gets_its_reason_and_keeps_its_raw_bytes(spark, kind):
    (row,) = validate(spark, [BAD_RECORDS[kind]])
    codes = {e["error_code"] for e in row[ERRORS]}
    assert codes == EXPECTED_CODES[kind]
    assert row[RAW] == BAD_RECORDS[kind]
    assert all(e["message"] and e["stage"] and e["plugin"] for e in row[ERRORS])


def test_a_record_reports_all_its_type_errors_at_once(spark):
    record = {
        "engagement_id": "x",
        "org_id": "o",
        "activity_type": "call",
        "event_time": "noon",
        "duration_seconds": "long",
    }
    (row,) = validate(spark, [json.dumps(record).encode()])
    assert {(e["column_name"], e["error_code"], e["stage"]) for e in row[ERRORS]} == {
        ("event_time", "wrong_type", "convert"),
        ("duration_seconds", "wrong_type", "convert"),
    }


def test_a_record_reports_all_its_validation_errors_at_once(spark):
    record = {"engagement_id": " ", "activity_type": "fax", "event_time": "2026-01-01T00:00:00Z"}
    (row,) = validate(spark, [json.dumps(record).encode()])
    assert {(e["column_name"], e["error_code"]) for e in row[ERRORS]} == {
        ("activity_type", "not_in_enum"),
        ("org_id", "missing_required"),
        ("engagement_id", "missing_required"),
    }


def test_duplicates_within_a_batch_keep_the_first_and_report_the_rest(spark):
    first, copy = json.dumps(GOOD).encode(), json.dumps({**GOOD, "call_outcome": "no_answer"}).encode()
    other_org = json.dumps({**GOOD, "org_id": "00D2"}).encode()
    validated = validate_rows(spark, [(1, 5, copy), (0, 9, b"garbage"), (0, 7, first), (0, 8, other_org)])
    marked, duplicates = mark_duplicates_in_batch(validated)
    codes = {(r[SOURCE_PARTITION], r[SOURCE_OFFSET]): [e["error_code"] for e in r[ERRORS]] for r in marked.to_pylist()}
    assert codes == {(0, 7): [], (0, 8): [], (0, 9): ["malformed_record"], (1, 5): ["duplicate_in_batch"]}
    assert [marked[SOURCE_OFFSET][i].as_py() for i in duplicates] == [5]


def test_empty_value_and_size_limit_are_configurable(spark):
    rows = validate(spark, [None, json.dumps(GOOD).encode()], max_record_bytes=50)
    assert [[e["error_code"] for e in r[ERRORS]] for r in rows] == [["empty_record"], ["oversized"]]


def test_keys_the_table_already_holds_are_reported_once_per_row_and_only_on_valid_rows(spark):
    held = json.dumps(GOOD).encode()
    same_id_other_org = json.dumps({**GOOD, "org_id": "00D2"}).encode()
    bad_but_held = json.dumps({**GOOD, "activity_type": "fax"}).encode()
    validated = validate_rows(spark, [(0, 1, held), (0, 2, same_id_other_org), (0, 3, bad_but_held)])
    existing = pa.table(
        {"org_id": ["00D1", "00D3"], "engagement_id": ["e1", "e1"], "batch_id": pa.array([4, 6], pa.int64())}
    )
    marked, flagged = mark_already_in_table(validated, existing)
    codes = {r[SOURCE_OFFSET]: [e["error_code"] for e in r[ERRORS]] for r in marked.to_pylist()}
    assert codes == {1: ["already_in_table"], 2: [], 3: ["not_in_enum"]}
    assert flagged == [0] and "written by batch 4" in marked[ERRORS][0].as_py()[0]["message"]
    assert mark_already_in_table(validated, existing.slice(0, 0)) == (validated, [])
