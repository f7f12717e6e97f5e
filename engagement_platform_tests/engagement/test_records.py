import json

import pytest

from engagement_platform.engagement.records import RecordRules, mark_duplicates_in_batch, parse_and_validate
from engagement_platform_tests.helpers import BAD_RECORDS, EXPECTED_CODES

SCHEMA = "kafka_partition int, kafka_offset long, key binary, value binary, kafka_timestamp_ms long"
GOOD = {"engagement_id": "e1", "org_id": "00D1", "activity_type": "call", "event_time": "2026-03-04T05:06:07Z",
        "duration_seconds": 61, "call_outcome": "connected", "payload": {"step": 2}}


def validate(spark, values: list[bytes | None], rules=RecordRules()):
    df = spark.createDataFrame([(0, i, None, v, 0) for i, v in enumerate(values)], SCHEMA)
    return parse_and_validate(df, rules).toArrow().to_pylist()


def test_good_record_is_typed_and_has_no_errors(spark):
    (row,) = validate(spark, [json.dumps(GOOD).encode()])
    assert row["errors"] == []
    assert row["value"] is None  # raw bytes only travel back for bad records
    assert str(row["engagement_date"]) == "2026-03-04"
    assert row["event_time"].isoformat().startswith("2026-03-04T05:06:07")
    assert row["duration_seconds"] == 61
    assert json.loads(row["payload"]) == {"step": 2}


@pytest.mark.parametrize("kind", sorted(BAD_RECORDS))
def test_each_kind_of_bad_record_gets_its_reason_and_keeps_its_raw_bytes(spark, kind):
    (row,) = validate(spark, [BAD_RECORDS[kind]])
    codes = {e["error_code"] for e in row["errors"]}
    assert codes and codes <= EXPECTED_CODES[kind] | {"missing_field"}
    assert codes & EXPECTED_CODES[kind]
    assert row["value"] == BAD_RECORDS[kind]
    assert all(e["message"] for e in row["errors"])


def test_a_record_reports_all_its_errors_at_once(spark):
    record = {"engagement_id": "x", "org_id": "o", "activity_type": "fax", "event_time": "noon", "duration_seconds": "long"}
    (row,) = validate(spark, [json.dumps(record).encode()])
    assert {(e["column_name"], e["error_code"]) for e in row["errors"]} == {
        ("activity_type", "unknown_activity_type"), ("event_time", "wrong_type"), ("duration_seconds", "wrong_type"),
    }


def test_duplicates_within_a_batch_keep_the_first_and_report_the_rest(spark):
    first, copy = json.dumps(GOOD).encode(), json.dumps({**GOOD, "call_outcome": "no_answer"}).encode()
    other_org = json.dumps({**GOOD, "org_id": "00D2"}).encode()
    df = spark.createDataFrame([(1, 5, None, copy, 0), (0, 9, None, b"garbage", 0), (0, 7, None, first, 0), (0, 8, None, other_org, 0)], SCHEMA)
    marked, duplicates = mark_duplicates_in_batch(parse_and_validate(df, RecordRules()).toArrow())
    codes = {(r["kafka_partition"], r["kafka_offset"]): [e["error_code"] for e in r["errors"]] for r in marked.to_pylist()}
    assert codes == {(0, 7): [], (0, 8): [], (0, 9): ["not_json"], (1, 5): ["duplicate_in_batch"]}
    assert [marked["kafka_offset"][i].as_py() for i in duplicates] == [5]


def test_empty_value_and_size_limit_are_configurable(spark):
    rows = validate(spark, [None, json.dumps(GOOD).encode()], RecordRules(max_record_bytes=50))
    assert [[e["error_code"] for e in r["errors"]] for r in rows] == [["empty_record"], ["oversized"]]
