"""The vectorized record path (ingest/vector_plan.py) held to the record-format contract: generated good and
bad records go through the DuckDB plan and through the slow reference (reference.py, the docs page in code),
and every row must come out the same: typed values, every error struct, raw bytes and input columns.

DuckDB only, no Spark: the plans run in this process, one small batch per example."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime
from functools import cache
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from engagement_platform.ingest.config import PipelineConfig, load_pipeline
from engagement_platform.ingest.pipeline import Pipeline
from engagement_platform.ingest.registry import plugin_problems
from engagement_platform.ingest.sql_types import NoSqlForm
from engagement_platform.ingest.vector_plan import VectorPlan, compile_plan
from engagement_platform_tests.ingest.generated_records import (
    SPACES,
    Column,
    RecordShape,
    batches,
    boolean_edges,
    boolean_words,
    choice_edges,
    choices,
    decimal_edges,
    email_edges,
    emails,
    identifiers,
    integer_edges,
    integers_in,
    mostly,
    name_edges,
    names,
    nested_tokens,
    patterned_edges,
    plain_texts,
    render_object,
    spaced,
    timestamp_edges,
    valid_patterned,
    valid_timestamps,
    words,
)
from engagement_platform_tests.ingest.reference import ReferenceRow, run_reference

REPO = Path(__file__).resolve().parents[2]
ENGAGEMENT_YAML = REPO / "engagement_platform" / "engagement" / "ingestion" / "pipeline.yaml"
# Each example is a batch of records through one plan run (DuckDB plans the query anew each run, ~0.1 s for
# the larger pipeline): modest counts of larger batches keep the module well under a minute. No shrinking: it
# would take minutes of plan runs, and a failure already names the record and the field that differ.
EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

# rewards_members (pipelines/rewards_members.yaml) as JSON lines, with every built-in plugin at least once
MEMBERS_YAML = """
name: rewards_members_json
source:
  format: jsonl
  path: rewards_members/*.jsonl
  max_record_bytes: 700
  columns: {id: string, name: string, nick: string, bday: string, level: string, tier: string, email: string,
            points: string, bonus_points: string, score: string, ratio: string, small: string, active: string,
            joined: string, joined_at: string, seen_at: string, signup: string, tags: string}
target:
  table: rewards_members_json
  quarantine_table: quarantine_rewards_members_json
  columns:
    member_id: {type: long, required: true}
    first_name: {type: string, required: true}
    last_name: {type: string}
    display_name: {type: string}
    birth_date: {type: date, min: "1900-01-01"}
    rewards_level: {type: string, enum: [bronze, silver, gold]}
    tier: {type: string}
    email: {type: string, regex: "^[^@\\\\s]+@[^@\\\\s]+\\\\.[a-z]+$"}
    points: {type: int, min: 0, max: 1000000}
    score: {type: double, min: -1.5, max: 1.0e+6}
    ratio: {type: float, min: -1.0e+6, max: 1.0e+6}
    small: {type: short, min: -100}
    active: {type: boolean}
    joined: {type: date, formats: [dd.MM.yyyy, yyyy/MM/dd]}
    joined_at: {type: timestamp, min: "2000-01-01T00:00:00+01:00", max: "2100-01-01"}
    seen_at: {type: timestamp, formats: ["yyyy-MM-dd HH:mm:ss", "MM/dd/yyyy HH:mm"]}
    signup_date: {type: date}
    tag3: {type: string}
converters:
  - {plugin: rename, from: id, to: member_id}
  - {plugin: split, column: name, into: [first_name, last_name], min_parts: 1}
  - {plugin: concat, columns: [nick, bonus_points], to: display_name, separator: " / "}
  - {plugin: cast, column: bday, to: birth_date, type: date, formats: [MM/dd/yyyy, yyyy-MM-dd]}
  - {plugin: map_values, column: level, to: rewards_level,
     mapping: {B: bronze, S: silver, G: gold, bronze: bronze, silver: silver, gold: gold}}
  - {plugin: map_values, column: tier, mapping: {P: platinum, Std: standard}, default: none, case_sensitive: true}
  - {plugin: coalesce, column: points, sources: [bonus_points], type: int}
  - {plugin: cast, column: signup, to: signup_date, type: date, default_from: [joined_at]}
  - {plugin: split, column: tags, into: [tag1, tag2, tag3], separator: ", "}
  - {plugin: coalesce, column: last_name, sources: [nick]}
validators:
  - {plugin: required, columns: [email]}
  - {plugin: required, columns: [nick], allow_blank: true}
  - {plugin: regex, column: first_name, pattern: "^[A-Za-z' -]+$"}
  - {plugin: enum, column: tier, values: [platinum, none]}
  - {plugin: range, column: birth_date, min: "1950-01-01", max: "2020-12-31"}
  - {plugin: range, column: joined_at, max: "2030-06-30T12:00:00"}
  - {plugin: range, column: score, min: 0.5}
  - {plugin: range, column: small, max: 99}
  - {plugin: range, column: points, min: 10.5}
"""

# Every source column a text target: the JSON reader's own rules, nothing typed on top
TEXTS_YAML = """
name: json_texts
source:
  format: kafka
  topic: texts
  columns: {a: string, b: string}
target:
  table: json_texts
  quarantine_table: quarantine_json_texts
  columns: {a: {type: string}, b: {type: string}}
"""


def config_from(text: str) -> PipelineConfig:
    config = PipelineConfig.model_validate(yaml.safe_load(text))
    assert plugin_problems(config) == []
    return config


def with_limit(config: PipelineConfig, max_record_bytes: int) -> PipelineConfig:
    return config.model_copy(update={"source": config.source.model_copy(update={"max_record_bytes": max_record_bytes})})


@cache
def pipeline_and_plan(name: str) -> tuple[Pipeline, VectorPlan]:
    config = {
        "engagement": lambda: with_limit(load_pipeline(ENGAGEMENT_YAML), 900),
        "members": lambda: config_from(MEMBERS_YAML),
        "texts": lambda: config_from(TEXTS_YAML),
    }[name]()
    pipeline = Pipeline.from_config(config)
    return pipeline, compile_plan(pipeline)


# ---- running both sides ------------------------------------------------------------------------------


def raw_table(records: list[bytes | None]) -> pa.Table:
    n = len(records)
    return pa.table(
        {
            "_row_id": pa.array([1000 + i for i in range(n)], pa.int64()),
            "_source_partition": pa.array([i % 3 for i in range(n)], pa.int32()),
            "_source_offset": pa.array([50 + i for i in range(n)], pa.int64()),
            "_raw": pa.array(records, pa.binary()),
        }
    )


def as_compared(row: ReferenceRow) -> dict:
    return {
        "position": (row.row_id, row.partition, row.offset),
        "values": row.values,
        "errors": row.errors,
        "raw": row.raw,
        "input": row.input,
    }


def plan_rows(plan: VectorPlan, pipeline: Pipeline, raw: pa.Table) -> list[dict]:
    result = sorted(plan.run(raw).to_pylist(), key=lambda r: r["_row_id"])
    return [
        {
            "position": (r["_row_id"], r["_source_partition"], r["_source_offset"]),
            "values": {c: r[c] for c in pipeline.target_columns},
            "errors": r["_errors"],
            "raw": r["_raw"],
            "input": json.loads(r["_input"]) if r["_input"] is not None else None,
        }
        for r in result
    ]


def assert_plan_matches_reference(name: str, records: list[bytes | None]) -> list[dict]:
    return assert_matches(*pipeline_and_plan(name), records)


def assert_matches(pipeline: Pipeline, plan: VectorPlan, records: list[bytes | None]) -> list[dict]:
    """Every record through the plan and through the reference: the same row, record by record."""
    raw = raw_table(records)
    rows = [(r["_row_id"], r["_source_partition"], r["_source_offset"], r["_raw"]) for r in raw.to_pylist()]
    expected = [as_compared(r) for r in run_reference(pipeline, rows)]
    got = plan_rows(plan, pipeline, raw)
    assert len(got) == len(expected)
    for record, planned, reference in zip(records, got, expected):
        assert planned == reference, f"record {record!r}"
    return got


# ---- the pipelines' records ------------------------------------------------------------------------

ENGAGEMENT = RecordShape(
    {
        "org_id": Column(identifiers, plain_texts),
        "engagement_id": Column(identifiers, spaced(plain_texts)),
        "activity_type": Column(
            mostly(st.sampled_from(["email_sent", "call", "meeting", "video_viewed"]), "Call", "CALL", "calls"),
            choice_edges,
        ),
        **{
            name: Column(plain_texts, plain_texts, optional=True)
            for name in ("lead_id", "account_id", "user_id", "cadence_id", "template_id", "subject", "call_outcome")
        },
        "contact_id": Column(identifiers, integer_edges),
        "payload": Column(nested_tokens, plain_texts),  # its JSON as a string, or (broken) a nested value itself
        "event_time": Column(valid_timestamps(), timestamp_edges),
        "engagement_date": Column(valid_timestamps(), timestamp_edges, optional=True),
        "duration_seconds": Column(
            integers_in(-(2**31), 2**31 - 1), st.one_of(integer_edges, decimal_edges), optional=True
        ),
    }
)
MEMBERS = RecordShape(
    {
        "id": Column(integers_in(-(2**63), 2**63 - 1), integer_edges),
        "name": Column(mostly(names, "J0hn Doe", "\u00c9va Nagy", "O'Neil Mary-Ann", "Ann\n"), name_edges),
        "nick": Column(plain_texts, SPACES, optional=True),
        "bday": Column(
            mostly(
                valid_patterned(("MM/dd/yyyy", "yyyy-MM-dd"), datetime(1950, 1, 1), datetime(2020, 12, 31, 23)),
                *["01/01/1950", "12/31/2020", "1949-12-31", "2021-01-01", "1899-12-31", "1900-01-01"],
            ),
            st.one_of(patterned_edges(("MM/dd/yyyy", "yyyy-MM-dd")), timestamp_edges),
        ),
        "level": Column(
            mostly(choices("B", "S", "G", "gold", "silver", "bronze"), "S\u0130LVER", "\u03a3\u03a3", "G\u212a", "P"),
            choice_edges,
        ),
        "tier": Column(mostly(choices("P", "Std", "x"), "p", "STD", ""), choice_edges),
        "email": Column(
            mostly(emails, "a b@x.com", "a@b.COM", "a@b.com\n", "a\x0bb@x.io", "@x.io", " a@b.io"), email_edges
        ),
        "points": Column(mostly(integers_in(11, 10**6), "10", "11", "1000000", "1000001", "-1"), integer_edges),
        "bonus_points": Column(integers_in(-(10**6), 10**6), integer_edges, optional=True),
        "score": Column(
            mostly(spaced(st.floats(0.5, 1e6).map(repr)), "0.5", "0.49999999999999994", "1e6", "1000000.0000000001"),
            decimal_edges,
        ),
        "ratio": Column(  # floats DuckDB itself would quote a digit longer than the shortest text
            mostly(spaced(st.floats(-1e6, 1e6, width=32).map(repr)), "2175463.75", "-3061734.25", "54422552", "1e6"),
            decimal_edges,
        ),
        "small": Column(
            mostly(integers_in(-100, 99), "99", "100", "-100", "-101", "32767", "-32768", "32768", "-32769"),
            integer_edges,
        ),
        "active": Column(boolean_words, boolean_edges),
        "joined": Column(valid_patterned(("dd.MM.yyyy", "yyyy/MM/dd")), patterned_edges(("dd.MM.yyyy", "yyyy/MM/dd"))),
        "joined_at": Column(
            mostly(
                valid_timestamps(datetime(2000, 1, 1), datetime(2030, 6, 30)),
                *[
                    "2000-01-01T00:00:00+01:00",
                    "1999-12-31T23:00:00Z",
                    "1999-12-31 22:59:59.999999",
                    "2030-06-30T12:00",
                    "2030-06-30T12:00:00.000001",
                    "2030-06-30T13:00:00+01:00",
                    "2030-06-30T13:00:00.000001+01:00",
                    "2100-01-01",
                    "2099-12-31T23:59:59.999999-00:01",
                ],
            ),
            timestamp_edges,
        ),
        "seen_at": Column(
            valid_patterned(("yyyy-MM-dd HH:mm:ss", "MM/dd/yyyy HH:mm")),
            patterned_edges(("yyyy-MM-dd HH:mm:ss", "MM/dd/yyyy HH:mm")),
        ),
        "signup": Column(valid_timestamps(), timestamp_edges, optional=True),
        "tags": Column(
            mostly(st.lists(words, min_size=3, max_size=5).map(", ".join), "a, b", "a,b,c", "a, , b", " a, b, c, "),
            st.one_of(plain_texts, st.lists(words, max_size=4).map(", ".join)),
        ),
    }
)


# ---- the properties -------------------------------------------------------------------------------------


@EXAMPLES
@given(batches(ENGAGEMENT, 900))
def test_the_engagement_pipeline_on_the_plan_equals_the_reference(records):
    assert_plan_matches_reference("engagement", records)


@EXAMPLES
@given(batches(MEMBERS, 700))
def test_a_pipeline_of_every_builtin_plugin_on_the_plan_equals_the_reference(records):
    assert_plan_matches_reference("members", records)


TWO_VALUES = st.builds(lambda a, b: render_object([('"a"', a), ('"b"', b)]).encode(), nested_tokens, nested_tokens)


@EXAMPLES
@given(st.lists(TWO_VALUES, min_size=1, max_size=16))
def test_json_values_read_as_text_as_the_reference_reads_them(records):
    assert_plan_matches_reference("texts", records)


# ---- the documented tolerances, as examples ----------------------------------------------------------


def texts_of(*records: bytes) -> list[tuple[str | None, str | None]]:
    rows = assert_plan_matches_reference("texts", list(records))
    assert all(row["errors"] == [] for row in rows)
    return [(row["values"]["a"], row["values"]["b"]) for row in rows]


def test_a_trailing_comma_and_nan_are_accepted():
    assert texts_of(b'{"a": [1, 2,], "b": NaN,}', b'{"a": -Infinity}') == [("[1,2]", "NaN"), ("-Infinity", None)]


def test_the_first_of_duplicate_keys_wins():
    assert texts_of(b'{"a": 1, "a": 2, "b": null, "b": "x"}') == [("1", None)]


def test_numbers_read_as_their_shortest_text_and_integers_as_written():
    records = [b'{"a": 1.50, "b": 1e3}', b'{"a": 1e22, "b": 1e400}', b'{"a": -0, "b": 123456789012345678901234567890}']
    assert texts_of(*records) == [("1.5", "1000.0"), ("1e+22", "1e400"), ("0", "123456789012345678901234567890")]


def test_a_nested_value_reads_as_compact_json():
    record = b'{"a": {"k": [1.50, "\\u00e9\\n", true, null], "k": {}}, "b": "\\u00e9"}'
    assert texts_of(record) == [('{"k":[1.5,"é\\n",true,null],"k":{}}', "é")]


def test_records_that_are_not_one_json_object_are_malformed():
    rows = assert_plan_matches_reference("texts", [b'["a"]', b'{"a": 1} x', b"\xff{}", b'{"a": "\\ud800"}', b"", None])
    assert [[e["error_code"] for e in row["errors"]] for row in rows] == [
        ["malformed_record"],
        ["malformed_record"],
        ["malformed_record"],
        ["malformed_record"],
        ["empty_record"],
        ["empty_record"],
    ]


MEMBER = {
    "id": "7",
    "name": "Ann Lee",
    "nick": "A",
    "bday": "01/02/1990",
    "level": "G",
    "tier": "P",
    "email": "ann@example.com",
    "points": "20",
    "score": "1.5",
    "small": "1",
    "joined_at": "2026-01-02T02:30:00Z",
    "seen_at": "2026-01-02 02:30:00",
    "tags": "a, b, c",
}
ACTIVITY = {"org_id": "o", "engagement_id": "e", "activity_type": "call"}
# Records whose values or errors depend on reading times as UTC: no offset, a UTC day, a timestamp bound and message
ZONED_RECORDS = {
    "engagement": [
        {**ACTIVITY, "event_time": "2026-01-02 02:30"},
        {**ACTIVITY, "event_time": "2026-01-02T02:30Z"},
        {**ACTIVITY, "event_time": "2026-03-29T01:30:00+05:00", "engagement_date": "2026-03-29T01:30:00+05:00"},
    ],
    "members": [
        MEMBER,
        {**MEMBER, "joined_at": "2030-06-30T14:00:00Z"},
        {**MEMBER, "joined_at": "2030-06-30T12:00:00"},
    ],
}


def shown(values: dict) -> dict[str, str]:
    return {name: str(value) for name, value in values.items()}


def test_times_read_the_same_in_any_session_time_zone():
    """An executor's time zone is none of the plan's business: no offset means UTC, a day is the UTC day, a
    timestamp bound without an offset is UTC, messages quote UTC."""
    records = {name: [json.dumps(r).encode() for r in rows] for name, rows in ZONED_RECORDS.items()}
    script = textwrap.dedent(
        f"""
        import json
        from engagement_platform_tests.ingest import test_vector_plan as t
        out = {{}}
        for name, records in {records!r}.items():
            pipeline, plan = t.pipeline_and_plan(name)
            rows = plan.run(t.raw_table(records)).to_pylist()
            out[name] = [[t.shown({{c: r[c] for c in pipeline.target_columns}}), r["_errors"]] for r in rows]
        print(json.dumps(out))
        """
    )
    env = {**os.environ, "TZ": "America/New_York", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    expected = {
        name: [
            [shown(row.values), row.errors]
            for row in run_reference(pipeline_and_plan(name)[0], [(i, 0, i, raw) for i, raw in enumerate(rows)])
        ]
        for name, rows in records.items()
    }
    assert json.loads(done.stdout) == expected
    assert expected["engagement"][0][0]["event_time"] == "2026-01-02 02:30:00+00:00"
    assert expected["members"][0] == [{**expected["members"][0][0], "signup_date": "2026-01-02"}, []]
    assert [e["message"] for e in expected["members"][1][1]] == [
        "2030-06-30T14:00:00.000000Z is outside [, 2030-06-30T12:00:00]"
    ]


def test_a_pattern_re2_refuses_keeps_the_pipeline_on_spark():
    config = config_from(
        MEMBERS_YAML.replace('pattern: "^[A-Za-z\' -]+$"', 'pattern: "^(?!x)[a-z]+$"')  # a lookahead
    )
    with pytest.raises(NoSqlForm, match="RE2"):
        compile_plan(Pipeline.from_config(config))
