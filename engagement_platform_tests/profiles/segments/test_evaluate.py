"""Segments: definitions load or fail with one line per problem; the one-pass evaluator gives exactly the
membership of the slow reference that evaluates each segment alone over plain dicts (hypothesis), over
payloads whose paths hold scalars, arrays (of mixed elements), JSON nulls or nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.profiles.segments.array_warnings import array_rows
from engagement_platform.profiles.segments.columns import Profiles, profiles_of
from engagement_platform.profiles.segments.definitions import (
    SIZE_OPS,
    Aggregate,
    AllOf,
    AnyOf,
    Cmp,
    HasType,
    Ids,
    Not,
    Profile,
    Segment,
    SegmentError,
    load_segments,
    parse_segment,
)
from engagement_platform.profiles.segments.evaluate import evaluate, member_pairs, paths_of
from engagement_platform.profiles.segments.reference import members

NOW = datetime(2026, 2, 1, 12, tzinfo=UTC)
TYPES = ["person", "trial", "cart_add", "purchase"]
PRODUCTS = ["X", "Y", "Z"]

values = st.one_of(st.sampled_from(PRODUCTS), st.integers(-3, 3), st.booleans(), st.sampled_from([1.5, -0.5]))
# Elements an array op looks for, chosen to collide across kinds: 1, 1.0, "1" and true.
elements = st.one_of(st.sampled_from(["gold", "silver", "1", "X"]), st.integers(0, 2), st.just(1.0), st.booleans())
ARRAY_PATHS = ["fields.tags", "fields.product", "fields.cart", "fields.cart.product"]
array_cmps = st.one_of(
    st.builds(Cmp, st.sampled_from(ARRAY_PATHS), st.just("has"), elements),
    st.builds(
        Cmp,
        st.sampled_from(ARRAY_PATHS),
        st.sampled_from(["has_any", "has_all"]),
        st.lists(elements, min_size=1, max_size=3).map(tuple),
    ),
    st.builds(Cmp, st.sampled_from(ARRAY_PATHS), st.sampled_from(SIZE_OPS), st.integers(0, 3)),
)
record_cmps = st.one_of(
    st.builds(Cmp, st.just("record_type"), st.sampled_from(["=", "!="]), st.sampled_from(TYPES)),
    st.builds(Cmp, st.just("country"), st.sampled_from(["=", "<", ">=", "exists"]), st.sampled_from(["DE", "FR"])),
    st.builds(
        Cmp,
        st.sampled_from(["fields.product", "fields.n", "fields.cart.product", "fields.tags"]),
        st.sampled_from(["=", "!=", "<", ">", "exists"]),
        values,
    ),
    st.builds(
        Cmp,
        st.just("fields.product"),
        st.just("in"),
        st.lists(st.sampled_from(PRODUCTS), min_size=1, max_size=2).map(tuple),
    ),
    st.builds(Cmp, st.sampled_from(["fields.note", "fields.tags"]), st.just("contains"), st.sampled_from(["a", "bc"])),
    array_cmps,
)
record_conds = st.recursive(
    record_cmps,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: AllOf(tuple(xs))),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: AnyOf(tuple(xs))),
        inner.map(Not),
    ),
    max_leaves=4,
)
windows = st.one_of(st.none(), st.sampled_from([3600.0, 86400.0, 7 * 86400.0]))
aggregates = st.one_of(
    st.builds(
        Aggregate, st.just("exists"), st.one_of(st.none(), record_conds), windows, st.none(), st.just(">="), st.just(1)
    ),
    st.builds(
        Aggregate,
        st.just("count"),
        st.one_of(st.none(), record_conds),
        windows,
        st.none(),
        st.sampled_from([">=", "=", "<"]),
        st.integers(0, 3),
    ),
    st.builds(
        Aggregate,
        st.sampled_from(["min", "max"]),
        st.one_of(st.none(), record_conds),
        windows,
        st.sampled_from(["fields.n", "fields.product"]),
        st.sampled_from(["<", ">=", "="]),
        values,
    ),
)
identity_leaves = st.one_of(
    aggregates,
    st.builds(HasType, st.sampled_from(TYPES)),
    st.builds(Ids, st.sampled_from([">=", "=", "<"]), st.integers(1, 3)),
    st.builds(Profile, record_cmps),
)
identity_conds = st.recursive(
    identity_leaves,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: AllOf(tuple(xs))),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: AnyOf(tuple(xs))),
        inner.map(Not),
    ),
    max_leaves=5,
)

# What an array in a payload holds: elements of every kind, duplicates, nulls, and arrays / objects (which
# match no element).
array_items = st.one_of(elements, st.none(), st.just(["gold"]), st.just({"gold": 1}))
payloads = st.fixed_dictionaries(
    {},
    optional={
        "product": st.one_of(st.sampled_from(PRODUCTS), st.lists(st.sampled_from(PRODUCTS), max_size=3)),
        "n": st.one_of(st.integers(-3, 3), st.just(1.5), st.lists(st.integers(-3, 3), max_size=2)),
        "note": st.one_of(st.sampled_from(["abc", "x"]), st.lists(st.sampled_from(["abc", "x"]), max_size=2)),
        "tags": st.one_of(st.none(), elements, st.lists(array_items, max_size=4)),
        "cart": st.one_of(
            st.fixed_dictionaries({"product": st.one_of(st.sampled_from(PRODUCTS), st.lists(elements, max_size=3))}),
            st.lists(st.fixed_dictionaries({"product": st.sampled_from(PRODUCTS)}), max_size=2),
            st.lists(st.sampled_from(PRODUCTS), max_size=3),
        ),
    },
)
rows = st.builds(
    lambda pid, t, hours, country, fields: {
        "primary_id": pid,
        "record_type": t,
        "cdc_ts": NOW - timedelta(hours=hours),
        "country": country,
        "email": None,
        "updated_at": None,
        "fields": json.dumps(fields) if fields is not None else None,
    },
    st.sampled_from(["u1", "u2", "u3"]),
    st.sampled_from(TYPES),
    st.integers(-2, 300),
    st.sampled_from([None, "DE", "FR"]),
    st.one_of(st.none(), payloads),
)


RAW = pa.schema(
    [
        ("component_id", pa.string()),
        ("primary_id", pa.string()),
        ("record_type", pa.string()),
        ("cdc_ts", pa.timestamp("us", tz="UTC")),
        ("email", pa.string()),
        ("country", pa.string()),
        ("updated_at", pa.timestamp("us", tz="UTC")),
        ("fields", pa.string()),
    ]
)


def profiles_for(identities: dict[str, list[dict]], segments: list[Segment]) -> Profiles:
    """The identities' rows as the evaluator's columns of the paths the segments read."""
    rows = [{**{c: None for c in RAW.names}, **r, "component_id": key} for key, rs in identities.items() for r in rs]
    return profiles_of(pa.Table.from_pylist(rows, schema=RAW), paths_of(segments))


def one_pass(identities: dict[str, list[dict]], segments: list[Segment]) -> list[tuple[str, str]]:
    """The columnar evaluator over the identities' rows, as (identity, segment) pairs."""
    profiles = profiles_for(identities, segments)
    pairs = member_pairs(profiles, evaluate(profiles, segments, NOW))
    return list(zip(pairs["identity"].to_pylist(), pairs["segment"].to_pylist()))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(identity_conds, min_size=1, max_size=6),
    st.dictionaries(st.sampled_from(["c1", "c2", "c3", "c4"]), st.lists(rows, min_size=1, max_size=5)),
)
def test_one_pass_equals_each_segment_evaluated_alone(conditions, identities):
    segments = [Segment(f"s{i}", "", c, "test") for i, c in enumerate(conditions)]
    got = one_pass(identities, segments)
    expected = {(key, s.name) for s in segments for key in members(s, identities, NOW)}
    assert set(got) == expected and len(got) == len(expected)


def test_the_talk_s_example_reads_as_yaml_and_selects_the_right_profile(tmp_path):
    (tmp_path / "all").mkdir()
    (tmp_path / "all" / "trial.yaml").write_text("""
name: trialled_x_not_purchased
description: Trialled product X in the last 7 days, added Y to the cart, has not purchased.
where:
  all:
    - exists: {where: {all: [{path: record_type, op: "=", value: trial}, {path: fields.product, op: "=", value: X}]}, within: 7d}
    - exists: {where: {path: fields.cart.product, op: "=", value: Y}}
    - not: {exists: {where: {path: record_type, op: "=", value: purchase}}}
""")
    (segment,) = load_segments(tmp_path, "acme")

    def row(pid, t, days, fields):
        return {"primary_id": pid, "record_type": t, "cdc_ts": NOW - timedelta(days=days), "fields": json.dumps(fields)}

    identities = {
        "in": [row("a", "trial", 2, {"product": "X"}), row("b", "cart_add", 1, {"cart": {"product": "Y"}})],
        "too_old": [row("c", "trial", 9, {"product": "X"}), row("d", "cart_add", 1, {"cart": {"product": "Y"}})],
        "bought": [
            row("e", "trial", 2, {"product": "X"}),
            row("f", "cart_add", 1, {"cart": {"product": "Y"}}),
            row("g", "purchase", 0, {}),
        ],
    }
    got = one_pass(identities, [segment])
    assert got == [("in", "trialled_x_not_purchased")] and members(segment, identities, NOW) == {"in"}


@pytest.mark.parametrize(
    "where, at, problem",
    [
        ({"exist": {}}, "where", "unknown function 'exist'"),
        ({"profile": {"path": "colour", "op": "=", "value": "red"}}, "where.profile.path", "unknown field 'colour'"),
        (
            {"profile": {"path": "country", "op": ">", "value": 5}},
            "where.profile.value",
            "type mismatch: country is a string",
        ),
        (
            {"profile": {"path": "cdc_ts", "op": ">", "value": "yesterday"}},
            "where.profile.value",
            "type mismatch: cdc_ts is a timestamp",
        ),
        ({"count": {"op": ">=", "value": "two"}}, "where.count.value", "type mismatch: count compares a number"),
        ({"exists": {"within": "a week"}}, "where.exists.within", "is not a duration"),
        ({"max": {"op": ">", "value": 3}}, "where.max", "max needs the path"),
        ({"all": []}, "where.all", "expected a non-empty list"),
        ({"profile": {"path": "country", "op": "~", "value": "DE"}}, "where.profile.op", "unknown operator '~'"),
    ],
)
def test_a_bad_definition_names_the_file_the_path_and_the_problem(tmp_path, where, at, problem):
    (tmp_path / "acme").mkdir()
    path = tmp_path / "acme" / "bad.yaml"
    path.write_text(json.dumps({"name": "bad", "where": where}))
    with pytest.raises(SegmentError) as raised:
        load_segments(tmp_path, "acme")
    assert any(line.startswith(f"{path}: {at}: ") and problem in line for line in str(raised.value).splitlines()), str(
        raised.value
    )


def test_bad_syntax_and_every_problem_of_every_file_are_reported_together(tmp_path):
    (tmp_path / "all").mkdir()
    (tmp_path / "all" / "a.yaml").write_text("name: [unclosed")
    (tmp_path / "all" / "b.yaml").write_text(json.dumps({"name": "B", "where": {"has_type": 3}, "owner": "x"}))
    with pytest.raises(SegmentError) as raised:
        load_segments(tmp_path)
    lines = str(raised.value).splitlines()
    assert any("a.yaml: (top level): bad syntax" in line for line in lines)
    assert {line.split(": ", 2)[1] for line in lines if "b.yaml" in line} == {"owner", "name", "where.has_type"}
    assert parse_segment({"name": "ok", "where": {"ids": {"op": ">=", "value": 2}}}, "x")[0].where == Ids(">=", 2)


def test_a_count_reads_from_a_file_and_takes_a_number():
    """A count's value is a number, not a primary_id (a string): a count segment loads from a file."""
    where = {
        "count": {
            "where": {"path": "record_type", "op": "=", "value": "page_view"},
            "within": "7d",
            "op": ">=",
            "value": 3,
        }
    }
    segment, problems = parse_segment({"name": "ok", "where": where}, "x")
    assert problems == [] and segment.where == Aggregate(
        "count", Cmp("record_type", "=", "page_view"), 7 * 86400.0, None, ">=", 3
    )
    _, problems = parse_segment({"name": "bad", "where": {"count": {"path": "fields.n", "op": ">=", "value": 3}}}, "x")
    assert problems == ["x: where.count.path: count takes no path (it counts the records where matches)"]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(identity_conds, min_size=1, max_size=4),
    st.lists(st.dictionaries(st.sampled_from(["c1", "c2", "c3"]), st.lists(rows, min_size=1, max_size=4)), max_size=3),
)
def test_tenants_evaluated_together_get_each_one_s_own_answer(conditions, tenants):
    """Several tenants as the parts of one set of profiles (as a task evaluates them): the same component
    and primary ids in two tenants are two identities, and each part gets what it gets alone."""
    segments = [Segment(f"s{i}", "", c, "test") for i, c in enumerate(conditions)]
    rows = [
        {**{c: None for c in RAW.names}, **r, "component_id": key, "part": part}
        for part, identities in enumerate(tenants)
        for key, rs in identities.items()
        for r in rs
    ]
    together = profiles_of(
        pa.Table.from_pylist(rows, schema=RAW.append(pa.field("part", pa.int64()))), paths_of(segments), within="part"
    )
    results = evaluate(together, segments, NOW)

    for (identities, records), alone in zip(together.part_ranges(len(tenants)), tenants):
        keys = together.keys[identities].to_pylist()
        got = {
            (key, name) for name, verdict in results.items() for key, inside in zip(keys, verdict[identities]) if inside
        }
        assert got == set(one_pass(alone, segments))
        assert array_rows(together, segments, records) == array_rows(profiles_for(alone, segments), segments)
