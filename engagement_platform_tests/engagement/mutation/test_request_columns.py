"""The driver-side request checks and canonical JSON (request_columns), on slices shaped like the
framework's output: no Spark needed, the checks are Arrow masks over those columns."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta

import orjson
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.engagement.mutation import request_text
from engagement_platform.engagement.mutation.request_columns import (
    CANONICAL_SCHEMA,
    check_requests,
    mutation_requests,
)
from engagement_platform.engagement.mutation.request_text import request_json
from engagement_platform.engagement.mutation.validate import request_from_json
from engagement_platform.ingest.errors import ERROR_FIELDS, ERRORS, SOURCE_OFFSET, SOURCE_PARTITION

ERROR_TYPE = pa.list_(pa.struct([(f, pa.string()) for f in ERROR_FIELDS]))
TEXT_COLUMNS = (
    "request_id",
    "org_id",
    "op",
    "from_field",
    "from_id",
    "to_field",
    "to_id",
    "field",
    "from_ids",
    "id",
    "engagement_id",
    "record",
)
T0 = datetime(2026, 1, 6, 10, 0, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def slice_of(rows: list[dict]) -> pa.Table:
    """The framework's validated slice: text columns, typed time and dates, errors, source position."""
    columns = {c: pa.array([r.get(c) for r in rows], pa.string()) for c in TEXT_COLUMNS}
    columns["request_time"] = pa.array([r.get("request_time", T0) for r in rows], pa.timestamp("us", tz="UTC"))
    columns["date_from"] = pa.array([r.get("date_from") for r in rows], pa.date32())
    columns["date_to"] = pa.array([r.get("date_to") for r in rows], pa.date32())
    columns[ERRORS] = pa.array([r.get(ERRORS, []) for r in rows], ERROR_TYPE)
    columns[SOURCE_PARTITION] = pa.array([0] * len(rows), pa.int32())
    columns[SOURCE_OFFSET] = pa.array(range(len(rows)), pa.int64())
    return pa.table(columns)


def req(rid, op, org="o1", **fields):
    return {"request_id": rid, "org_id": org, "op": op, **fields}


def codes(checked) -> dict[int, list[str]]:
    return {i: [e["error_code"] for e in errors] for i, errors in checked.errors.items()}


def test_each_check_names_the_row_and_the_reason():
    rows = [
        req("ok", "convert", from_field="lead_id", from_id="L1", to_field="contact_id", to_id="C1"),
        req("c", "convert", from_field="lead_id", from_id="L1", to_field="contact_id", to_id="  "),
        req("m", "merge", field="lead_id", from_ids='"L1"', to_id="L2"),
        req("m2", "merge", field="lead_id", from_ids='["L1", ""]'),
        req("u", "update", engagement_id="e1", record='{"colour": "red"}'),
        req("u2", "update", engagement_id="e1", record="[1]"),
        req("d", "delete", engagement_id="e1", field="lead_id"),
        req("d2", "delete", field="lead_id"),
        req("r", "delete", engagement_id="e1", date_from=date(2026, 2, 1), date_to=date(2026, 1, 1)),
        req("ok", "delete", engagement_id="e2"),  # a repeated id: the first one wins
        req("ok", "delete", org="o2", engagement_id="e2"),  # the same id in another org is another request
        req(
            "s", "delete", engagement_id="e3", **{ERRORS: [dict.fromkeys(ERROR_FIELDS, "x")]}
        ),  # the framework rejected it
        req("s", "delete", engagement_id="e3"),  # so this one is the first that passes
    ]
    checked = check_requests(slice_of(rows))
    assert codes(checked) == {
        1: ["missing_required"],
        2: ["wrong_type"],
        3: ["wrong_type", "missing_required"],
        4: ["wrong_type"],
        5: ["wrong_type"],
        6: ["ambiguous_target"],
        7: ["missing_required"],
        8: ["invalid_date_range"],
        9: ["duplicate_in_batch"],
    }
    assert [e["column_name"] for e in checked.errors[7]] == ["id"]
    assert "record.colour: not a column an update can set" in checked.errors[4][0]["message"]
    assert checked.errors[8][0]["message"] == "date_to 2026-01-01 is before date_from 2026-02-01"
    assert checked.requests[SOURCE_OFFSET].to_pylist() == [0, 10, 12]


def test_canonical_columns_keep_only_what_the_op_uses():
    rows = [
        req(
            "m",
            "merge",
            field="lead_id",
            from_ids='["L1","L2"]',
            to_id="L3",
            from_field="contact_id",
            engagement_id="e9",
        ),
        req(
            "u",
            "update",
            engagement_id="e1",
            record='{"subject": "s", "engagement_date": "2026-01-02", "lead_id": "L1"}',
            id="x",
        ),
        req("d", "delete", field="lead_id", id="L1", to_id="x", date_from=date(2026, 1, 1), date_to=date(2026, 1, 31)),
    ]
    checked = check_requests(slice_of(rows))
    assert checked.errors == {}
    table = checked.requests
    assert table.select(CANONICAL_SCHEMA.names).to_pylist() == [
        {
            **dict.fromkeys(CANONICAL_SCHEMA.names),
            "request_id": "m",
            "org_id": "o1",
            "request_time": T0,
            "op": "merge",
            "field": "lead_id",
            "from_ids": ["L1", "L2"],
            "to_id": "L3",
        },
        {
            **dict.fromkeys(CANONICAL_SCHEMA.names),
            "request_id": "u",
            "org_id": "o1",
            "request_time": T0,
            "op": "update",
            "engagement_id": "e1",
            "record": '{"engagement_date":"2026-01-02","lead_id":"L1","subject":"s"}',
        },
        {
            **dict.fromkeys(CANONICAL_SCHEMA.names),
            "request_id": "d",
            "org_id": "o1",
            "request_time": T0,
            "op": "delete",
            "field": "lead_id",
            "id": "L1",
            "date_from": date(2026, 1, 1),
            "date_to": date(2026, 1, 31),
        },
    ]
    assert checked.records == [None, {"subject": "s", "engagement_date": date(2026, 1, 2), "lead_id": "L1"}, None]
    # request_json reads back (request_from_json) as the same request the fold gets from the columns
    from_json = [request_from_json(json.loads(text)) for text in request_json(table).to_pylist()]
    from_columns = mutation_requests(table, checked.records)
    for a, b in zip(from_json, from_columns, strict=True):
        assert replace(a, request_time=b.request_time) == b  # the columns carry epoch micros, the JSON a datetime
        assert (a.request_time - EPOCH) // timedelta(microseconds=1) == b.request_time


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12), st.text(max_size=12), st.integers(0, 999_999))
def test_request_json_is_the_json_of_the_columns(request_id, org_id, micros):
    """Any text (quotes, backslashes, control characters, non-ASCII) and any microsecond round-trip."""
    at = T0.replace(microsecond=micros)
    table = pa.Table.from_pylist(
        [
            {
                "request_id": request_id,
                "org_id": org_id,
                "request_time": at,
                "op": "delete",
                "engagement_id": request_id + org_id,
            }
        ],
        schema=CANONICAL_SCHEMA,
    )
    text = request_json(table)[0].as_py()
    assert json.loads(text) == {
        "request_id": request_id,
        "org_id": org_id,
        "op": "delete",
        "engagement_id": request_id + org_id,
        "request_time": at.isoformat().replace("+00:00", "Z"),
    }


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=4) | st.none(), max_size=6), st.data())
def test_from_ids_are_written_as_orjson_writes_them(lists, data):
    """The column-wise JSON of from_ids equals orjson's text of each list, in any chunking of the column
    and in the threaded form of request_json."""
    rows = [
        {"request_id": str(i), "org_id": "o", "request_time": T0, "op": "merge", "from_ids": ids}
        for i, ids in enumerate(lists)
    ]
    table = pa.Table.from_pylist(rows, schema=CANONICAL_SCHEMA)
    cut = data.draw(st.integers(0, len(rows)))
    chunked = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    for texts in (request_json(table).to_pylist(), request_json(chunked).to_pylist()):
        for ids, text in zip(lists, texts, strict=True):
            written = json.loads(text).get("from_ids")
            assert written == ids
            if ids is not None:
                assert f'"from_ids": {orjson.dumps(ids).decode()}' in text


def test_a_large_batch_is_written_by_threads_the_same_as_by_one(monkeypatch):
    rows = [
        {"request_id": f"r{i}", "org_id": f"o{i % 7}", "request_time": T0, "op": "merge", "from_ids": [f"c{i}", "x"]}
        for i in range(1000)
    ]
    table = pa.Table.from_pylist(rows, schema=CANONICAL_SCHEMA)
    one = request_json(table)
    monkeypatch.setattr(request_text, "JSON_ROWS_PER_THREAD", 100)
    assert request_json(table).to_pylist() == one.to_pylist()
