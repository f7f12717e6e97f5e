"""The pipeline's stages on the real Spark Connect server: parse, convert, validate, the one error
schema, joining errors back to the input, and the split into target and quarantine rows."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import LongType, StringType

from engagement_platform.ingest.builtin import Cast, Required
from engagement_platform.ingest.config import PipelineConfig, load_pipeline
from engagement_platform.ingest.errors import ERROR_FIELDS, ERRORS, RAW, ROW_ID, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import (
    Pipeline,
    QuarantineContext,
    errors_frame,
    good_frame,
    quarantine_frame,
    split_result,
)
from engagement_platform.ingest.sources import INPUT, read_file
from engagement_platform.spark import landing_source

REPO = Path(__file__).resolve().parents[2]
REWARDS = REPO / "pipelines" / "rewards_members.yaml"
ERROR_FRAME_COLUMNS = [(ROW_ID, LongType()), *[(f, StringType()) for f in ERROR_FIELDS]]
AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def config_from(text: str) -> PipelineConfig:
    return PipelineConfig.model_validate(yaml.safe_load(text))


def codes(row: dict) -> list[tuple]:
    return sorted((e["stage"], e["plugin"], e["column_name"], e["error_code"]) for e in row[ERRORS])


# ---- a CSV file mixing every kind of bad row (the shipped rewards_members pipeline) --------------

MEMBERS_LINES = [
    "id,name,bday,level,email,points",  # 1: header
    "1,Ann Lee,01/02/1990,G,ann@example.com,10\r",  # 2: good (CRLF)
    "",  # 3: blank, not a record
    "2,Bob,1985-03-04,silver,bob@example.com,20",  # 4: good, one-part name
    '3,"Unclosed, quote',  # 5: parse
    "4,Too,Many,Fields,x@example.com,1,2,3",  # 6: parse
    "x5,Carl Zed,01/02/1990,G,carl@example.com,5",  # 7: conform (member_id)
    "6,Dan Q,13/45/1990,Q,not-an-email,-3",  # 8: cast fails first; its level/email/points are never checked
    "7,Eve Ng,1990-01-01,P,eve@example.com,5",  # 9: map_values
    "8,J0hn Doe,1800-01-01,gold,not-an-email,-5",  # 10: four validation errors at once
    "9,Zed Ray,1991-05-06,B,,7",  # 11: required (a plugin validator)
    "10,   ,1991-05-06,B,z@example.com,7",  # 12: blank name: required + regex
    "11,Amy Poe,02/03/2001,S,amy@example.com,abc",  # 13: conform (points)
    "12,Ben Ode,2001-02-03,b,ben@example.com,1000000",  # 14: good (lower-case code, max inclusive)
    "   ",  # 15: blank, not a record
    "13,Cy Twin,2001-02-03,gold,cy@example.com,0",  # 16: good, no final newline
]
MEMBERS_GOOD = {
    2: dict(
        member_id=1,
        first_name="Ann",
        last_name="Lee",
        birth_date=date(1990, 1, 2),
        rewards_level="gold",
        email="ann@example.com",
        points=10,
    ),
    4: dict(
        member_id=2,
        first_name="Bob",
        last_name=None,
        birth_date=date(1985, 3, 4),
        rewards_level="silver",
        email="bob@example.com",
        points=20,
    ),
    14: dict(
        member_id=12,
        first_name="Ben",
        last_name="Ode",
        birth_date=date(2001, 2, 3),
        rewards_level="bronze",
        email="ben@example.com",
        points=1000000,
    ),
    16: dict(
        member_id=13,
        first_name="Cy",
        last_name="Twin",
        birth_date=date(2001, 2, 3),
        rewards_level="gold",
        email="cy@example.com",
        points=0,
    ),
}
MEMBERS_ERRORS = {  # line -> (stage, plugin, column, code) of every error of the row
    5: [("parse", "parser", None, "malformed_record")],
    6: [("parse", "parser", None, "malformed_record")],
    7: [("convert", "conform", "member_id", "wrong_type")],
    8: [("convert", "cast", "bday", "wrong_type")],
    9: [("convert", "map_values", "level", "unmapped_value")],
    10: sorted(
        [
            ("validate", "target_schema", "birth_date", "out_of_range"),
            ("validate", "target_schema", "email", "pattern_mismatch"),
            ("validate", "target_schema", "points", "out_of_range"),
            ("validate", "regex", "first_name", "pattern_mismatch"),
        ]
    ),
    11: [("validate", "required", "email", "missing_required")],
    12: sorted(
        [
            ("validate", "target_schema", "first_name", "missing_required"),
            ("validate", "regex", "first_name", "pattern_mismatch"),
        ]
    ),
    13: [("convert", "conform", "points", "wrong_type")],
}


@pytest.fixture(scope="module")
def members(spark, tmp_path_factory):
    """The mixed file through the shipped pipeline, read in several line-aligned spans (both cores)."""
    path = tmp_path_factory.mktemp("members") / "members.csv"
    path.write_bytes("\n".join(MEMBERS_LINES).encode())
    config = load_pipeline(REWARDS)
    pipeline = Pipeline.from_config(config)
    parsed = read_file(spark, config.source, str(path), split_bytes=200)
    transformed = pipeline.transform(parsed)
    result = transformed.toArrow()
    good, quarantine = split_result(result, pipeline.target_columns, QuarantineContext(config.name, 7, str(path), AT))
    rows = {r[SOURCE_OFFSET]: r for r in result.to_pylist()}
    return dict(
        path=path,
        config=config,
        pipeline=pipeline,
        parsed=parsed,
        transformed=transformed,
        result=result,
        rows=rows,
        good=good,
        quarantine=quarantine,
    )


def test_every_record_comes_out_once_numbered_by_its_line(members):
    assert sorted(members["rows"]) == sorted([*MEMBERS_GOOD, *MEMBERS_ERRORS])  # header and blank lines are not records
    assert all(r[ROW_ID] == line and r[SOURCE_PARTITION] == 0 for line, r in members["rows"].items())


def test_parse_stage_keeps_unparsable_lines_with_their_raw_text(members):
    parsed = {
        r[SOURCE_OFFSET]: r
        for r in members["parsed"].select(SOURCE_OFFSET, RAW, "id", "name", INPUT, ERRORS).toArrow().to_pylist()
    }
    assert sorted(parsed) == sorted(members["rows"])
    assert parsed[2][RAW] == MEMBERS_LINES[1].rstrip("\r").encode()  # CRLF: the \r ends the line, it is not data
    assert parsed[2][INPUT] == dict(
        id="1", name="Ann Lee", bday="01/02/1990", level="G", email="ann@example.com", points="10"
    )
    for line in (5, 6):
        (err,) = parsed[line][ERRORS]
        assert (err["stage"], err["plugin"], err["error_code"]) == ("parse", "parser", "malformed_record")
        assert err["message"] == "record is not a CSV line with 6 fields"
        assert err["value"] == MEMBERS_LINES[line - 1] and parsed[line][RAW] == MEMBERS_LINES[line - 1].encode()
    assert parsed[6]["id"] == "4" and parsed[6][INPUT]["points"] == "1"  # PERMISSIVE: what did parse is kept
    assert all(r[ERRORS] == [] for line, r in parsed.items() if line not in (5, 6))


def test_good_rows_are_converted_and_typed(members):
    good = {line: {k: v for k, v in members["rows"][line].items() if k in MEMBERS_GOOD[2]} for line in MEMBERS_GOOD}
    assert good == MEMBERS_GOOD
    assert all(members["rows"][line][ERRORS] == [] and members["rows"][line][RAW] is None for line in MEMBERS_GOOD)
    by_id = lambda r: r["member_id"]  # noqa: E731
    assert sorted(members["good"].to_pylist(), key=by_id) == sorted(MEMBERS_GOOD.values(), key=by_id)


def test_the_good_rows_have_the_target_types(members):
    schema = members["good"].schema
    assert schema.field("member_id").type == pa.int64() and schema.field("points").type == pa.int32()
    assert schema.field("birth_date").type == pa.date32()


def test_each_bad_row_reports_its_stage_plugin_column_and_code(members):
    assert {line: codes(members["rows"][line]) for line in MEMBERS_ERRORS} == MEMBERS_ERRORS


def test_convert_errors_quote_the_offending_value(members):
    rows = members["rows"]
    (cast,) = rows[8][ERRORS]
    assert (
        cast["message"] == "'13/45/1990' is not a valid date (formats: MM/dd/yyyy, yyyy-MM-dd)"
        and cast["value"] == "13/45/1990"
    )
    (mapped,) = rows[9][ERRORS]
    assert mapped["message"] == "'P' has no mapping (known: B, S, G, bronze, silver, gold)" and mapped["value"] == "P"
    (conform,) = rows[7][ERRORS]
    assert conform["message"] == "'x5' is not a valid long" and conform["value"] == "x5"


def test_a_row_that_fails_a_converter_goes_no_further(members):
    # line 8 also has an unmapped level, a bad email and negative points: none of that is reported
    assert codes(members["rows"][8]) == [("convert", "cast", "bday", "wrong_type")]
    # line 5 did not parse: no converter or validator adds to its parse error
    assert codes(members["rows"][5]) == [("parse", "parser", None, "malformed_record")]


def test_a_row_reports_all_its_validation_errors_at_once(members):
    errors = {(e["column_name"], e["plugin"]): e for e in members["rows"][10][ERRORS]}
    assert errors[("birth_date", "target_schema")]["message"] == "1800-01-01 is outside [1900-01-01, ]"
    assert errors[("points", "target_schema")]["message"] == "-5 is outside [0, 1000000]"
    assert errors[("points", "target_schema")]["value"] == "-5"
    assert errors[("email", "target_schema")]["value"] == "not-an-email"
    assert errors[("first_name", "regex")]["message"] == "'J0hn' does not match ^[A-Za-z' -]+$"


def test_every_error_has_the_one_error_schema(members):
    for row in members["result"].to_pylist():
        assert all(tuple(e) == ERROR_FIELDS for e in row[ERRORS])
    assert members["result"].schema.field(ERRORS).type.value_type.names == list(ERROR_FIELDS)
    # every stage's error DataFrame has the same columns and types: the pipeline's, and each plugin's own contract
    parsed, config = members["parsed"], members["config"]
    cast = Cast("cast", Cast.Params(column="bday", type="date"), config.target.columns)
    frames = {
        "pipeline": errors_frame(members["transformed"]),
        "converter": cast.convert(parsed.drop(ERRORS))[1],
        "validator": Required("required", Required.Params(columns=["email"]), config.target.columns).validate(parsed),
    }
    for name, frame in frames.items():
        assert [(f.name, f.dataType) for f in frame.schema.fields] == ERROR_FRAME_COLUMNS, name


def test_quarantine_joined_back_in_spark_equals_the_driver_split(members):
    """The reference's way (errors unioned, joined back to the input by row id) and the one-pass split agree."""
    joined = quarantine_frame(errors_frame(members["transformed"]), members["parsed"]).toArrow().to_pylist()
    spark_side = Counter(
        (r[SOURCE_PARTITION], r[SOURCE_OFFSET], *(r[f] for f in ERROR_FIELDS), r[RAW], r[INPUT]) for r in joined
    )
    q = members["quarantine"].to_pylist()
    driver_side = Counter(
        (r["source_partition"], r["source_offset"], *(r[f] for f in ERROR_FIELDS), r["raw"], r["input"]) for r in q
    )
    assert spark_side == driver_side
    assert len(q) == sum(len(v) for v in MEMBERS_ERRORS.values())  # one quarantine row per error
    path = members["path"]
    assert {r["row_id"] for r in q} == {f"{path}:{line}" for line in MEMBERS_ERRORS}
    assert all(r["pipeline"] == "rewards_members" and r["batch_id"] == 7 and r["source"] == str(path) for r in q)
    by_line = {r["source_offset"]: r for r in q}
    assert by_line[7]["raw"] == MEMBERS_LINES[6].encode()
    assert json.loads(by_line[7]["input"]) == dict(
        id="x5", name="Carl Zed", bday="01/02/1990", level="G", email="carl@example.com", points="5"
    )


def test_good_rows_are_the_converted_rows_anti_joined_with_the_errors(members):
    columns = members["pipeline"].target_columns
    transformed = members["transformed"]
    anti = transformed.join(errors_frame(transformed), ROW_ID, "left_anti").select(ROW_ID, *columns).toArrow()
    assert sorted(anti[ROW_ID].to_pylist()) == sorted(MEMBERS_GOOD)
    key = lambda r: r["member_id"]  # noqa: E731
    assert sorted(anti.select(columns).to_pylist(), key=key) == sorted(members["good"].to_pylist(), key=key)
    assert sorted(good_frame(transformed, columns).toArrow().to_pylist(), key=key) == sorted(
        MEMBERS_GOOD.values(), key=key
    )


def test_counts_are_conserved(members):
    records = [line for line in MEMBERS_LINES[1:] if line.strip()]
    quarantined_rows = {r["source_offset"] for r in members["quarantine"].to_pylist()}
    assert members["result"].num_rows == len(records) == members["good"].num_rows + len(quarantined_rows)
    assert not quarantined_rows & set(MEMBERS_GOOD)


def test_without_a_header_the_first_line_is_a_record(spark, members):
    config = members["config"]
    source = config.source.model_copy(update={"options": {**config.source.options, "header": False}})
    config = config.model_copy(update={"source": source})
    result = (
        Pipeline.from_config(config)
        .transform(read_file(spark, config.source, str(members["path"])))
        .toArrow()
        .to_pylist()
    )
    rows = {r[SOURCE_OFFSET]: r for r in result}
    assert sorted(rows) == sorted([1, *members["rows"]])  # same numbering: line 1 is now data
    assert codes(rows[1]) == [
        ("convert", "cast", "bday", "wrong_type")
    ]  # the header's 'bday' is the first thing to fail
    assert rows[1][RAW] == MEMBERS_LINES[0].encode()
    assert {line: codes(rows[line]) for line in MEMBERS_ERRORS} == MEMBERS_ERRORS


# ---- JSON lines: nested objects and every built-in plugin ----------------------------------------

JSONL_PIPELINE = """
name: contacts
source:
  format: jsonl
  path: contacts/*.jsonl
  columns:
    first: string
    last: string
    full: string
    code: string
    day: string
    seen: string
    when_day: string
    n: string
    alt: string
    tag: string
    profile: "struct<age:string,address:struct<city:string,zip:string>>"
target:
  table: contacts
  quarantine_table: quarantine_contacts
  columns:
    label: {type: string, required: true}
    name: {type: string}
    given: {type: string}
    family: {type: string}
    day_date: {type: date}
    when_day: {type: date}
    level: {type: string}
    grade: {type: string}
    n: {type: int}
    age: {type: int}
    city: {type: string}
converters:
  - {plugin: rename, from: tag, to: label}
  - {plugin: concat, columns: [first, last], to: name}
  - {plugin: split, column: full, into: [given, family], separator: "|"}
  - {plugin: cast, column: day, to: day_date, type: date, formats: [dd.MM.yyyy]}
  - {plugin: cast, column: when_day, type: date, default_from: [seen]}
  - {plugin: map_values, column: code, to: level, mapping: {A: alpha, B: beta}}
  - {plugin: map_values, column: code, to: grade, mapping: {A: top}, default: other, case_sensitive: true}
  - {plugin: coalesce, column: n, sources: [alt], type: int}
  - {plugin: cast, column: profile.age, to: age, type: int}
  - {plugin: rename, from: profile.address.city, to: city}
validators:
  - {plugin: enum, column: label, values: [x, y]}
  - {plugin: range, column: n, min: 1, max: 9}
  - {plugin: regex, column: given, pattern: "^[A-Z]"}
  - {plugin: required, columns: [city], allow_blank: true}
"""
BASE = dict(
    first="Ann",
    last="Lee",
    full="Ann|Lee",
    code="a",
    day="01.02.2020",
    seen=None,
    when_day="2020-05-06",
    n="5",
    alt=None,
    tag="x",
    profile={"age": "30", "address": {"city": "Oslo", "zip": "0150"}},
)
JSONL_ROWS = [  # (changes to BASE, expected errors (plugin, column, code) or expected values)
    (
        {},
        {
            "label": "x",
            "name": "Ann Lee",
            "given": "Ann",
            "family": "Lee",
            "day_date": date(2020, 2, 1),
            "when_day": date(2020, 5, 6),
            "level": "alpha",
            "grade": "other",
            "n": 5,
            "age": 30,
            "city": "Oslo",
        },
    ),
    (
        dict(
            first=None,
            code="A",
            seen="2021-03-04T23:30:00-05:00",
            when_day=None,
            n=None,
            alt="7",
            profile={"age": "41", "address": {"city": " "}},
        ),
        {"name": "Lee", "level": "alpha", "grade": "top", "when_day": date(2021, 3, 5), "n": 7, "age": 41, "city": " "},
    ),
    (dict(first=None, last=None), [("concat", "name", "missing_value")]),
    (dict(full="Cher"), [("split", "full", "split_mismatch")]),
    (dict(full="Ann.Lee"), [("split", "full", "split_mismatch")]),  # the separator is a literal, not a regex
    (dict(day="31.02.2020"), [("cast", "day", "wrong_type")]),
    (
        dict(when_day="someday", seen="2021-01-01"),
        [("cast", "when_day", "wrong_type")],
    ),  # present but invalid: never replaced
    (dict(code="Z"), [("map_values", "code", "unmapped_value")]),
    (dict(n="abc", alt="4"), [("coalesce", "n", "wrong_type")]),  # present but invalid: never silently skipped
    (
        dict(profile={"age": "old", "address": {"city": "Rome"}}),
        [("cast", "profile.age", "wrong_type")],
    ),  # nested field fails
    (
        dict(tag="z", n="50", full="ann|lee"),
        [("enum", "label", "not_in_enum"), ("range", "n", "out_of_range"), ("regex", "given", "pattern_mismatch")],
    ),
    (
        dict(tag=None, profile={"age": "3"}),
        [("required", "city", "missing_required"), ("target_schema", "label", "missing_required")],
    ),
]


@pytest.fixture(scope="module")
def contacts(spark, tmp_path_factory):
    folder = tmp_path_factory.mktemp("contacts")
    path = folder / "contacts.jsonl"
    lines = [json.dumps({**BASE, **changes}) for changes, _ in JSONL_ROWS]
    lines += [
        '{"first": "Ann", "profile": "not an object"}',
        '{"first": "Ann", "last": ',
        '[{"first": "Ann"}]',
    ]  # parse errors
    path.write_text("\n".join(lines) + "\n")
    config = config_from(JSONL_PIPELINE)
    result = Pipeline.from_config(config).transform(read_file(spark, config.source, str(path))).toArrow()
    return {r[SOURCE_OFFSET]: r for r in result.to_pylist()}, lines


def test_every_builtin_plugin_converts_and_reports_its_errors(contacts):
    rows, _ = contacts
    for line, (changes, expected) in enumerate(JSONL_ROWS, start=1):
        row = rows[line]
        if isinstance(expected, dict):
            assert row[ERRORS] == [], (line, changes, row[ERRORS])
            assert {k: row[k] for k in expected} == expected, (line, changes)
        else:
            assert sorted((e["plugin"], e["column_name"], e["error_code"]) for e in row[ERRORS]) == sorted(expected), (
                line,
                changes,
            )


def test_json_lines_that_do_not_parse_are_errors_with_their_raw_text(contacts):
    rows, lines = contacts
    for line in range(len(JSONL_ROWS) + 1, len(lines) + 1):
        (err,) = rows[line][ERRORS]
        assert (err["stage"], err["error_code"], err["message"]) == (
            "parse",
            "malformed_record",
            "record is not one JSON object",
        )
        assert rows[line][RAW] == lines[line - 1].encode() and err["value"] == lines[line - 1]


def test_a_nested_field_failing_a_converter_fails_only_its_row(contacts):
    rows, _ = contacts
    nested = next(i for i, (c, _) in enumerate(JSONL_ROWS, start=1) if c.get("profile", {}).get("age") == "old")
    (err,) = rows[nested][ERRORS]
    assert err["message"] == "'old' is not a valid int" and err["value"] == "old"
    assert json.loads(rows[nested][INPUT])["profile"] == {"age": "old", "address": {"city": "Rome"}}
    assert rows[1]["age"] == 30 and rows[1]["city"] == "Oslo"


# ---- a whole JSON document -----------------------------------------------------------------------

DOCUMENT_PIPELINE = """
name: orders
source: {format: json, path: "orders/*.json", columns: {id: string, qty: string, item: "struct<sku:string>"}}
target:
  table: orders
  quarantine_table: quarantine_orders
  columns: {id: {type: long, required: true}, qty: {type: int, min: 1}, sku: {type: string, regex: "^[A-Z]{3}$"}}
converters:
  - {plugin: rename, from: item.sku, to: sku}
"""


def test_a_json_document_is_one_record_per_array_element(spark, tmp_path):
    path = tmp_path / "orders.json"
    elements = [
        {"id": "1", "qty": "2", "item": {"sku": "ABC"}},
        {"id": "x", "qty": "3"},
        {"id": "3", "qty": "0", "item": {"sku": "toolong"}},
        {"qty": "4", "item": {"sku": "DEF"}},
    ]
    path.write_text(json.dumps(elements, indent=2))
    config = config_from(DOCUMENT_PIPELINE)
    pipeline = Pipeline.from_config(config)
    result = pipeline.transform(read_file(spark, config.source, str(path))).toArrow()
    rows = {r[SOURCE_OFFSET]: r for r in result.to_pylist()}
    assert sorted(rows) == [0, 1, 2, 3]  # offsets: element indexes
    assert rows[0][ERRORS] == [] and (rows[0]["id"], rows[0]["qty"], rows[0]["sku"]) == (1, 2, "ABC")
    assert codes(rows[1]) == [("convert", "conform", "id", "wrong_type")]
    assert codes(rows[2]) == [
        ("validate", "target_schema", "qty", "out_of_range"),
        ("validate", "target_schema", "sku", "pattern_mismatch"),
    ]
    assert codes(rows[3]) == [("validate", "target_schema", "id", "missing_required")]
    assert json.loads(rows[1][RAW]) == {"id": "x", "qty": "3"}  # the element's JSON stands for its raw bytes
    good, quarantine = split_result(result, pipeline.target_columns, QuarantineContext(config.name, 1, str(path), AT))
    assert good.num_rows == 1 and sorted(set(quarantine["row_id"].to_pylist())) == [f"{path}:{i}" for i in (1, 2, 3)]


def test_a_corrupt_json_document_is_one_parse_error_with_its_text(spark, tmp_path):
    path = tmp_path / "broken.json"
    text = '[{"id": "1", "qty": "2"},\n {"id": "2", '
    path.write_text(text)
    config = config_from(DOCUMENT_PIPELINE)
    (row,) = Pipeline.from_config(config).transform(read_file(spark, config.source, str(path))).toArrow().to_pylist()
    (err,) = row[ERRORS]
    assert (err["stage"], err["plugin"], err["error_code"], err["message"]) == (
        "parse",
        "parser",
        "malformed_record",
        "document is not valid JSON",
    )
    assert err["value"] == text and row[RAW] == text.encode()


# ---- line spans of landing files (no Spark: the data source's planning and reading) --------------


def read_spans(path: Path, split_bytes: int, skip_lines: int = 0) -> tuple[list, list[tuple[int, bytes]]]:
    reader = landing_source.LandingLinesReader(landing_source.options(str(path), skip_lines, split_bytes))
    spans = reader.partitions()
    records = []
    for span in spans:
        for batch in reader.read(span):
            records += zip(batch.column(0).to_pylist(), batch.column(1).to_pylist())
    return spans, records


def expected_records(data: bytes, skip_lines: int = 0) -> list[tuple[int, bytes]]:
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    out = []
    for number, line in enumerate(lines, start=1):
        line = line[:-1] if line.endswith(b"\r") else line
        if number > skip_lines and line.strip():
            out.append((number, line))
    return out


@settings(max_examples=300, deadline=None)
@given(
    data=st.lists(st.sampled_from([b"\n", b"\r\n", b"a", b"bc", b" ", b"\xff", b"\x00", b",", b'"']), max_size=80).map(
        b"".join
    ),
    split_bytes=st.integers(min_value=1, max_value=40),
)
def test_line_spans_cover_the_data_exactly_and_number_lines_right(data, split_bytes):
    spans = landing_source.line_spans(data, split_bytes)
    assert [s for s, _, _ in spans[:1]] == ([0] if data else [])
    assert all(end == next_start for (_, end, _), (next_start, _, _) in zip(spans, spans[1:]))  # no gap, no overlap
    assert (spans[-1][1] if spans else 0) == len(data)
    for start, end, first_line in spans:
        assert end > start and (end - start >= split_bytes or end == len(data))
        assert data[end - 1 : end] == b"\n" or end == len(data)  # spans end on a line boundary
        assert first_line == data.count(b"\n", 0, start) + 1


@settings(max_examples=100, deadline=None)
@given(
    data=st.lists(
        st.sampled_from([b"\n", b"\r\n", b"\r", b"x", b"yz", b"  ", b"\t\x0b\x0c", b"\xe9"]), max_size=60
    ).map(b"".join),
    split_bytes=st.integers(min_value=1, max_value=30),
    skip_lines=st.integers(min_value=0, max_value=2),
)
def test_reading_the_spans_gives_every_line_once_with_its_number(tmp_path_factory, data, split_bytes, skip_lines):
    path = tmp_path_factory.mktemp("spans") / "file.txt"
    path.write_bytes(data)
    _, records = read_spans(path, split_bytes, skip_lines)
    assert records == expected_records(data, skip_lines)


@given(size=st.integers(1, 10**10), slots=st.integers(1, 64))
def test_a_balanced_split_cuts_a_file_into_a_multiple_of_the_slots(size, slots):
    split = landing_source.balanced_split(size, slots)
    waves = -(-size // (landing_source.SPLIT_BYTES * slots))  # the fewest with ranges of at most SPLIT_BYTES
    ranges = -(-size // split)
    assert split <= landing_source.SPLIT_BYTES and ranges <= waves * slots
    if size >= (waves * slots) ** 2:  # a file far larger than the ranges (rounding aside: a 5-byte file in 4 ranges)
        assert ranges == waves * slots


def test_split_bytes_must_be_positive():
    with pytest.raises(ValueError, match="split_bytes must be positive"):
        landing_source.line_spans(b"a\nb\n", 0)


def test_an_empty_file_is_one_empty_span(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_bytes(b"")
    spans, records = read_spans(path, 16)
    assert len(spans) == 1 and records == []


# ---- elements of a whole JSON document (no Spark: the landing_document source's splitting) --------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
            max_leaves=8,
        ),
        max_size=6,
    ),
    st.sampled_from([None, 2]),
)
def test_a_documents_elements_are_its_own_bytes_and_parse_to_its_values(values, indent):
    """Against json.loads of the whole document: the same elements, each sliced from the file as it is."""
    document = json.dumps(values, indent=indent, ensure_ascii=False).encode()
    elements, broken = landing_source.document_elements(document)
    assert not broken and [json.loads(e) for e in elements] == json.loads(document)
    assert all(e in document for e in elements)


def test_document_elements_keep_digits_and_flag_what_does_not_parse():
    elements, broken = landing_source.document_elements(b'[{"a": 19.999999999999999999}, {"b":1E5} ,\n 3 ]')
    assert elements == [b'{"a": 19.999999999999999999}', b'{"b":1E5}', b"3"] and not broken
    assert landing_source.document_elements(b' {"id": "\\ud800"} ') == (
        [b'{"id": "\\ud800"}'],
        False,
    )  # one object: one record
    assert landing_source.document_elements(b"  \n") == ([], False) and landing_source.document_elements(b"[ ]") == (
        [],
        False,
    )
    for bad in (b'[{"a": 1},', b'{"a": 1} trailing', b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe"):
        assert landing_source.document_elements(bad) == ([bad], True)
