"""The profile CDC record's vectorized checks and staging columns (profiles/records.py) against Python's own
reading of the same text: `strict_json` must accept exactly what an RFC 8259 parser accepts (json.loads with
NaN and Infinity refused), and the promoted columns must be the last value of their key. DuckDB only."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import duckdb
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.profiles.records import strict_json, with_staging_columns_arrow
from engagement_platform_tests.ingest.generated_records import nested_tokens, plain_texts, render_array, render_object

RECORDS = settings(max_examples=300, deadline=None)


def refuse(constant: str) -> None:
    raise ValueError(constant)


def rfc_8259(text: str, kind: type) -> bool:
    try:
        value = json.loads(text, parse_constant=refuse)
    except ValueError:
        return False
    return isinstance(value, kind)


def duckdb_says(texts: list[str], opener: str) -> list[bool]:
    con = duckdb.connect()
    con.register("t", pa.table({"x": pa.array(texts, pa.string())}))
    return [row[0] for row in con.execute(f"SELECT {strict_json('x', opener)} FROM t").fetchall()]


objects = st.lists(st.tuples(st.sampled_from(['"a"', '"b"', '"a"']), nested_tokens), max_size=4).map(render_object)
arrays = st.lists(nested_tokens, max_size=4).map(render_array)
broken = st.one_of(plain_texts, st.builds(lambda t, cut: t[:cut], objects, st.integers(0, 30)))
spaced = st.builds(
    lambda a, t, b: a + t + b,
    st.sampled_from(["", " ", "\n"]),
    st.one_of(objects, arrays, broken),
    st.sampled_from(["", "\t"]),
)


@RECORDS
@given(st.lists(spaced, min_size=1, max_size=20))
def test_strict_json_accepts_what_an_rfc_8259_parser_accepts(texts):
    assert duckdb_says(texts, "{") == [rfc_8259(t, dict) for t in texts], texts
    assert duckdb_says(texts, "[") == [rfc_8259(t, list) for t in texts], texts


def test_the_reader_tolerances_are_refused_and_strings_may_hold_anything():
    texts = ['{"a": NaN}', '{"a": [1,]}', '{"a": -inf}', '{"tags": ["d", "b"]}', '{"a": "NaN,]"}', '{"a": "\\"]"}']
    assert duckdb_says(texts, "{") == [False, False, False, True, True, True]


@RECORDS
@given(st.lists(st.tuples(st.sampled_from(["email", "country", "x"]), nested_tokens), max_size=5))
def test_promoted_columns_are_the_last_value_of_their_key(pairs):
    text = render_object([(json.dumps(k), v) for k, v in pairs])
    if not rfc_8259(text, dict):
        return  # staging quarantines it: no staging columns
    rows = pa.table(
        {
            "cdc_ts": pa.array([datetime(2026, 1, 5, 10, 7, tzinfo=UTC)], pa.timestamp("us", tz="UTC")),
            "related_ids": pa.array(['["1", 2]'], pa.string()),
            "fields": pa.array([text], pa.string()),
            "_errors": pa.array([[]], pa.list_(pa.struct([("stage", pa.string())]))),
        }
    )
    (row,) = with_staging_columns_arrow(rows).to_pylist()
    last = json.loads(text)
    for key in ("email", "country"):
        value = last.get(key)
        expected = value if isinstance(value, str) or value is None else None
        if isinstance(value, str) or value is None:
            assert row[key] == expected, (text, key)
        else:
            assert json.loads(row[key]) == value, (text, key)  # another value: its JSON text
    assert (row["bucket"], row["related_ids"]) == ("20260105T1000", ["1", "2"])
