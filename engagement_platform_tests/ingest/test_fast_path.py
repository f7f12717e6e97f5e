"""The fast path decides a record only when Spark's pipeline gives the same row without an error: checked
here against the Spark pipeline itself (the reference) on the engagement ingestion pipeline, with records
generated to hit what the fast path must leave to Spark (numbers, nested values, odd timestamps, blanks,
duplicate keys, whitespace, escapes...), and on the demo's own traffic, which it must decide almost whole."""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engagement_platform.engagement.demo import ActivityGenerator
from engagement_platform.engagement.ingestion.records import ingestion_pipeline
from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.ingest.errors import ERRORS, RAW, ROW_ID, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.fast_path import UNDECIDED, FastPath
from engagement_platform.ingest.pipeline import Pipeline
from engagement_platform.ingest.sources import parse_text

CONFIG = ingestion_pipeline("t")
FAST = FastPath.for_pipeline(CONFIG)
TARGET = list(CONFIG.target.columns)


def spark_rows(spark, config: PipelineConfig, values: list[bytes]) -> list[dict]:
    """The reference: every record through the Spark pipeline, in input order."""
    rows = pa.table({ROW_ID: pa.array(range(len(values)), pa.int64()), SOURCE_PARTITION: pa.array([0] * len(values), pa.int32()),
                     SOURCE_OFFSET: pa.array(range(len(values)), pa.int64()), RAW: pa.array(values, pa.binary())})
    frame = Pipeline.from_config(config).transform(parse_text(spark.createDataFrame(rows), config.source))
    return comparable(frame.toArrow().sort_by(ROW_ID)).to_pylist()


def comparable(table: pa.Table) -> pa.Table:
    """Timestamps as UTC microseconds and dates as days: Spark may hold one Python cannot (year 0)."""
    for index, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            table = table.set_column(index, field.name, pc.cast(pc.cast(table[field.name], pa.timestamp("us", tz="UTC")), pa.int64()))
        elif pa.types.is_date(field.type):
            table = table.set_column(index, field.name, pc.cast(pc.cast(table[field.name], pa.date32()), pa.int32()))
    return table


def assert_decided_as_spark(spark, values: list[bytes]) -> int:
    decided, undecided = FAST.decide(0, list(range(len(values))), values)
    reference = spark_rows(spark, CONFIG, values)
    mine = {row[SOURCE_OFFSET]: row for row in comparable(decided).to_pylist()}
    for offset, row in mine.items():
        expected = reference[offset]
        assert expected[ERRORS] == [], (values[offset], expected[ERRORS])
        for name in TARGET:
            got, want = row[name], expected[name]
            assert got == want, (values[offset], name, got, want)
    assert sorted([*mine, *undecided]) == list(range(len(values)))
    return len(mine)


def test_the_pipeline_of_engagement_ingestion_has_a_fast_path():
    assert FAST is not None
    assert FastPath.for_pipeline(CONFIG.model_copy(update={"converters": [
        *CONFIG.converters, CONFIG.converters[0].model_copy(update={"plugin": "map_values"})]})) is None


def test_the_demo_traffic_is_decided_exactly_as_spark_does(spark):
    generator = ActivityGenerator(seed=5, bad_ratio=0.05)
    values = [generator.message()[1] for _ in range(3000)]
    decided = assert_decided_as_spark(spark, values)
    good = sum(1 for v in values if not FAST.decide_record(v) is UNDECIDED)
    assert decided == good and decided >= 0.9 * len(values), f"decided {decided} of {len(values)}"


TIMESTAMPS = [
    "2026-01-05T08:00:01Z", "2026-01-05T08:00:01.5+02:00", "2026-01-05T08:00:01.123456-07:30", "2026-01-05T08:00:01",
    "2026-01-05T08:00:01+18:00", "2026-01-05T08:00:01+19:00", "2026-01-05T08:00:01-00:00", "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-01:00", "2026-02-30T00:00:00Z", "2026-1-5", "2026-01-05 08:00:01", " 2026-01-05T08:00:01Z",
    "2026-01-05", "2026-01-05T24:00:00Z", "2026-01-05T08:00:60Z", "2026-01-05T08:00:01.1234567Z", "yesterday", "",
    "2026-01-05T08:00:01+02:75", "2026-01-05T08:00Z",
]
DATES = ["2026-01-05", "2026-1-5", "0000-01-01", "2026-02-29", "2024-02-29", "2026-01-05T01:00:00Z", " 2026-01-05", ""]
TEXTS = ["", " ", "\t", "  x ", "\u00e9", "a\nb", "\x1f", "/", "\\", '"', "e1", "web", "1.5", ":1.5", "\U0001F600"]
NUMBERS = [2**31 - 1, 2**31, -2**31, -2**31 - 1, 0, 7, -12, 2**40, 1.0, 1e7, 1.5, -0.0, 1e20, 2**63, 2**64]


def any_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(6 if depth < 2 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice(TEXTS)
    if kind == 2:
        return rng.choice(NUMBERS)
    if kind == 3:
        return rng.choice([True, False])
    if kind == 4:
        return [any_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {rng.choice(["a", "b", "step"]): any_value(rng, depth + 1) for _ in range(rng.randrange(3))}


def random_record(rng: random.Random) -> bytes:
    """A record of the engagement pipeline's fields with values the fast path must type or leave to Spark."""
    def pick(pool, plain=0.7):
        return rng.choice(pool) if rng.random() < plain else any_value(rng)

    record = {"org_id": pick(["00D1", "00D2"], 0.95), "engagement_id": pick(["e1", "e2", " e3"], 0.95),
              "activity_type": pick(["call", "email_sent", "fax_sent", "Call"], 0.95),
              "event_time": pick(TIMESTAMPS[:4] if rng.random() < 0.5 else TIMESTAMPS, 0.95)}
    for name in ("lead_id", "subject", "payload", "engagement_date", "duration_seconds", "Lead_ID", "extra", "_corrupt_record"):
        if rng.random() < 0.2:
            record[name] = pick(DATES if name == "engagement_date" else [str(n) for n in NUMBERS] + ["+12", " 12", "007"]
                                if name == "duration_seconds" else TEXTS)
    form = rng.choice(["compact", "compact", "python", "spaced", "duplicate", "ascii"])
    try:
        body = orjson.dumps(record)
    except TypeError:  # an integer beyond 64 bits
        body = json.dumps(record, separators=(",", ":")).encode()
    if form == "python":
        return json.dumps(record).encode()
    if form == "ascii":
        return json.dumps(record, separators=(",", ":")).encode()  # non-ASCII escaped as \\uXXXX
    if form == "spaced":
        return b" " + body + b"\n"
    if form == "duplicate":
        return body[:-1] + b',"activity_type":"call","payload":{"a":1,"a":2}}'
    return body


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_generated_records_are_decided_exactly_as_spark_does(spark, seed):
    rng = random.Random(seed)
    values = [random_record(rng) for _ in range(1500)]
    decided = assert_decided_as_spark(spark, values)
    assert decided >= 100, f"only {decided} of {len(values)} decided: the generator no longer reaches the fast path"


@pytest.mark.parametrize("value", [
    b'{"org_id":"o","engagement_id":"e","activity_type":"call","event_time":"2026-01-05T08:00:01Z","payload":{"x":1e7}}',
    b'{"org_id":"o","engagement_id":"e","activity_type":"call","event_time":"2026-01-05T08:00:01Z","payload":{"x":1,"x":2}}',
    b'{"org_id":"o","engagement_id":"e","activity_type":"call","event_time":"2026-01-05T08:00:01Z","duration_seconds":1.0}',
    b'{"org_id":" ","engagement_id":"e","activity_type":"call","event_time":"2026-01-05T08:00:01Z"}',
    b'{"org_id":"o","engagement_id":"e","activity_type":"call","event_time":"2026-01-05T08:00:01Z","_corrupt_record":"x"}',
    b'[{"org_id":"o"}]', b"", b"{", b'"x"',
])
def test_what_the_fast_path_leaves_to_spark(value):
    assert FAST.decide_record(value) is UNDECIDED


def test_a_plain_record_is_typed():
    row = FAST.decide_record(b'{"org_id":"o","engagement_id":"e","activity_type":"call","event_time":"2026-01-05T23:30:00-02:00",'
                             b'"duration_seconds":42,"payload":{"step":3,"channel":"web"}}')
    assert row is not UNDECIDED
    assert row["event_time"] == datetime(2026, 1, 6, 1, 30, tzinfo=timezone.utc)
    assert str(row["engagement_date"]) == "2026-01-06" and row["duration_seconds"] == 42
    assert row["payload"] == '{"step":3,"channel":"web"}'
    table, undecided = FAST.decide(2, [7], [b'{"org_id":"o","engagement_id":"e","activity_type":"call","event_time":"2026-01-05T08:00:01Z"}'])
    assert undecided == [] and table.num_rows == 1 and table.schema == FAST.schema()
    assert pc.equal(table[SOURCE_PARTITION], 2).to_pylist() == [True]


@pytest.mark.parametrize("seed", range(10))
def test_deciding_by_columns_equals_deciding_record_by_record(seed):
    """decide (Arrow kernels over columns) against decide_reference (decide_record, one record at a time)."""
    rng = random.Random(seed)
    values = [random_record(rng) for _ in range(2000)]
    generator = ActivityGenerator(seed=seed, bad_ratio=0.05)
    values += [generator.message()[1] for _ in range(500)]
    rng.shuffle(values)
    fast, fast_left = FAST.decide(3, list(range(len(values))), values)
    slow, slow_left = FAST.decide_reference(3, list(range(len(values))), values)
    assert fast_left == slow_left
    assert comparable(fast).equals(comparable(slow))
    assert fast.num_rows >= 500
