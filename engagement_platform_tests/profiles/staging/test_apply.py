"""The CDC dumper on the real broker, Spark Connect and Delta: validation, quarantine, exactly-once."""

import json
import threading
from datetime import UTC, datetime

import pyarrow.compute as pc
import pytest

from engagement_platform.ingest.record_tasks import SPARK, VECTORIZED
from engagement_platform.profiles.processor.apply import process_tenant, read_profiles
from engagement_platform.profiles.staging.apply import STREAM, app_id, split_staged, stage_cdc_batch, validate_cdc_slice
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, QUARANTINE_PROFILE_CDC, bucket_of
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import BatchPlan, KafkaSlice
from engagement_platform_tests.support.cdc import encode, new_topic, plan_all, record, stage
from engagement_platform_tests.support.crash import crash_then_rerun

BAD = {
    "not_json": (b'{"tenant": "acme", "primary_id": ', {"malformed_record"}),
    "oversized": (json.dumps(record("acme", "big", 1, {"blob": "x" * 3000})).encode(), {"oversized"}),
    "missing_tenant": (
        json.dumps(
            {"primary_id": "1", "record_type": "person", "op": "upsert", "cdc_seq": 1, "cdc_ts": "2026-01-05T10:00:00Z"}
        ).encode(),
        {"missing_required"},
    ),
    "missing_id": (
        json.dumps(
            {"tenant": "acme", "record_type": "person", "op": "upsert", "cdc_seq": 1, "cdc_ts": "2026-01-05T10:00:00Z"}
        ).encode(),
        {"missing_required"},
    ),
    "fields_not_object": (json.dumps(record("acme", "2", 1, "{not json")).encode(), {"invalid_json"}),
    # JSON's rules, not Spark's lenient defaults: the processor parses `fields` with a strict parser
    "fields_single_quoted": (json.dumps(record("acme", "7", 1, "{'a': 1}")).encode(), {"invalid_json"}),
    "fields_nan": (json.dumps(record("acme", "8", 1, '{"a": NaN}')).encode(), {"invalid_json"}),
    "related_not_array": (json.dumps(record("acme", "3", 1, {}, related="101")).encode(), {"invalid_json"}),
    "bad_tenant": (json.dumps(record("Acme Corp", "4", 1, {})).encode(), {"pattern_mismatch"}),
    "unknown_op": (json.dumps(record("acme", "5", 1, {}, op="merge")).encode(), {"not_in_enum"}),
    "bad_timestamp": (json.dumps(record("acme", "6", 1, {}, ts="yesterday")).encode(), {"wrong_type"}),
}


def good_records(n=20):
    return [
        record(
            "acme" if i % 2 else "globex",
            str(i),
            i,
            {"email": f"u{i}@x.io", "country": "DE", "n": i},
            related=[str(i + 1)],
            ts=f"2026-01-05T10:{i:02d}:00Z",
        )
        for i in range(n)
    ]


def test_dumper_stages_good_records_and_quarantines_each_bad_kind(spark, kafka, lake, checkpoints):
    topic = new_topic(kafka)
    good = good_records()
    result = stage(
        spark, kafka, lake, checkpoints, topic, good + [raw for raw, _ in BAD.values()], max_record_bytes=2048
    )

    assert (result.records_read, result.rows_staged, result.records_quarantined) == (
        len(good) + len(BAD),
        len(good),
        len(BAD),
    )
    staged = lake.read(PROFILE_CDC_STAGING.name).to_pylist()
    assert sorted(r["primary_id"] for r in staged) == sorted(r["primary_id"] for r in good)
    row = next(r for r in staged if r["primary_id"] == "7")
    assert (row["tenant"], row["bucket"], row["email"], row["country"], row["related_ids"], row["op"]) == (
        "acme",
        "20260105T1000",
        "u7@x.io",
        "DE",
        ["8"],
        "upsert",
    )
    assert json.loads(row["fields"]) == {"email": "u7@x.io", "country": "DE", "n": 7}
    assert row["bucket"] == bucket_of(row["cdc_ts"])
    assert {r["bucket"] for r in staged} == {"20260105T1000", "20260105T1015"}

    quarantined = lake.read(QUARANTINE_PROFILE_CDC.name).to_pylist()
    by_raw = {}
    for q in quarantined:
        by_raw.setdefault(q["raw"], set()).add(q["error_code"])
        assert q["row_id"] == f"{topic}:{q['source_partition']}:{q['source_offset']}" and q["message"]
    assert by_raw == {raw: codes for raw, codes in BAD.values()}


def test_the_vectorized_path_stages_what_the_spark_path_stages(spark, kafka, lake, checkpoints):
    """The same slice through the DuckDB plan with its staging query and through Spark: the same staging rows
    (bucket, ids, promoted columns) and the same error codes per record."""
    topic = new_topic(kafka)
    dated = record("acme", "90", 1, {"updated_at": "2026-01-05T10:06:59+01:00", "country": 49, "email": None})
    kafka.produce(topic, encode([*good_records(), dated, *(raw for raw, _ in BAD.values())]))
    plan = plan_all(kafka, checkpoints, topic)
    at = datetime.now(UTC)

    def staged(wanted: str) -> tuple[list[dict], dict, str]:
        validated, path = validate_cdc_slice(spark, kafka.bootstrap_servers, plan, 2048, wanted=wanted)
        good, errors = split_staged(validated, plan, at)
        rows = sorted(good.drop_columns(["fields"]).to_pylist(), key=lambda r: r["primary_id"])
        fields = {r["primary_id"]: json.loads(r["fields"]) if r["fields"] else None for r in good.to_pylist()}
        codes: dict = {}
        for r in errors.to_pylist():
            codes.setdefault((r["source_partition"], r["source_offset"]), set()).add(r["error_code"])
        return [{**r, "fields": fields[r["primary_id"]]} for r in rows], codes, path

    vectorized, vectorized_codes, path = staged(VECTORIZED)
    on_spark, spark_codes, spark_path = staged(SPARK)
    assert (path, spark_path) == ("vectorized", "spark")
    assert vectorized == on_spark and vectorized_codes == spark_codes
    assert len(vectorized) == len(good_records()) + 1 and len(vectorized_codes) == len(BAD)
    row = next(r for r in vectorized if r["primary_id"] == "90")
    assert (row["country"], row["email"], row["updated_at"]) == ("49", None, datetime(2026, 1, 5, 9, 6, 59, tzinfo=UTC))


def test_fields_given_as_a_json_string_are_accepted(spark, kafka, lake, checkpoints):
    topic = new_topic(kafka)
    stage(spark, kafka, lake, checkpoints, topic, [record("acme", "1", 1, json.dumps({"email": "a@b.c"}))])
    row = lake.read(PROFILE_CDC_STAGING.name).to_pylist()[0]
    assert json.loads(row["fields"]) == {"email": "a@b.c"} and row["email"] == "a@b.c"


def test_a_duplicate_key_in_fields_does_not_stop_the_batch_and_the_last_value_wins(spark, kafka, lake, checkpoints):
    """JSON allows repeated keys (json.loads keeps the last); Spark's default map policy would fail the
    whole query on one such record, halting the stream on a single bad producer."""
    topic = new_topic(kafka)
    head = json.dumps(record("acme", "1", 1, {}))[:-1]  # the record without its closing brace
    raw = head.replace('"fields": {}', '"fields": {"email": "old@x.io", "email": "new@x.io"}') + "}"
    assert '"email": "old@x.io", "email"' in raw
    result = stage(spark, kafka, lake, checkpoints, topic, [raw.encode(), record("acme", "2", 2, {"email": "b@x.io"})])
    assert (result.rows_staged, result.records_quarantined) == (2, 0)
    staged = {r["primary_id"]: r for r in lake.read(PROFILE_CDC_STAGING.name).to_pylist()}
    assert json.loads(staged["1"]["fields"]) == {"email": "new@x.io"} and staged["1"]["email"] == "new@x.io"
    process_tenant(spark, lake, checkpoints, "acme")  # the processor parses the same text again
    profiles = {r["primary_id"]: r for r in read_profiles(lake, "acme").to_pylist()}
    assert json.loads(profiles["1"]["fields"]) == {"email": "new@x.io"} and profiles["1"]["email"] == "new@x.io"


def test_rerun_of_a_staged_batch_changes_nothing(spark, kafka, lake, checkpoints):
    topic = new_topic(kafka)
    first = stage(spark, kafka, lake, checkpoints, topic, good_records(10) + [BAD["not_json"][0]])
    versions = {t: lake.table(t).version() for t in (PROFILE_CDC_STAGING.name, QUARANTINE_PROFILE_CDC.name)}
    again = stage_cdc_batch(spark, lake, checkpoints, kafka.bootstrap_servers, first.plan)
    assert set(again.versions.values()) == {None}
    assert {t: lake.table(t).version() for t in versions} == versions
    assert lake.read(PROFILE_CDC_STAGING.name).num_rows == 10


@pytest.mark.lake_stores("local", "s3")  # exactly-once on an object store too
@pytest.mark.parametrize("crash_after", [PROFILE_CDC_STAGING.name, QUARANTINE_PROFILE_CDC.name])
def test_dumper_killed_between_commits_then_rerun_is_exactly_once(
    spark, kafka, stack, lake, lake_root, checkpoints, crash_after
):
    topic = new_topic(kafka)
    kafka.produce(topic, encode(good_records(12) + [BAD["missing_id"][0]]))
    plan = plan_all(kafka, checkpoints, topic)

    crash_then_rerun(lake_root, lake, checkpoints, STREAM, app_id(STREAM), plan.batch_id, crash_after)
    assert lake.read(PROFILE_CDC_STAGING.name).num_rows == 12
    assert pc.count_distinct(lake.read(QUARANTINE_PROFILE_CDC.name)["row_id"]).as_py() == 1


def test_concurrent_dumpers_on_disjoint_partitions_never_conflict(spark, kafka, lake, checkpoints):
    topic = new_topic(kafka, partitions=2)
    records = good_records(30)
    for i, r in enumerate(records):
        kafka.produce(topic, encode([r]), partition=i % 2)
    marks = kafka.watermarks(topic)
    plans = [
        BatchPlan(f"{STREAM}/p{p}", 1, KafkaSlice(topic, (OffsetRange(p, marks[p][0], marks[p][1]),))) for p in (0, 1)
    ]
    for p in plans:
        checkpoints.record_plan(p)
    lake.ensure(PROFILE_CDC_STAGING)
    results, errors = {}, []

    def run(plan):
        try:
            results[plan.stream] = stage_cdc_batch(spark, lake, checkpoints, kafka.bootstrap_servers, plan)
        except Exception as exc:  # surfaced below: a conflict would land here
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(r.rows_staged for r in results.values()) == 30
    assert sorted(r["primary_id"] for r in lake.read(PROFILE_CDC_STAGING.name).to_pylist()) == sorted(
        r["primary_id"] for r in records
    )
