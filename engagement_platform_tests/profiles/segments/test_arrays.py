"""Array ops in segments (has, has_any, has_all, size<cmp>): each op on examples of every kind of value,
the one-pass evaluator against the slow reference over payloads dense in arrays (hypothesis), and the
warning a scalar op on a path that held arrays puts in the evaluation's metadata, from the task (no Spark:
the task function runs here in the test process) to the run's metadata."""

from __future__ import annotations

import json
from datetime import timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.profiles.segments.apply import SegmentResult, handed_by_tenant
from engagement_platform.profiles.segments.array_warnings import array_rows, array_warnings, scalar_reads
from engagement_platform.profiles.segments.definitions import (
    Aggregate,
    AllOf,
    AnyOf,
    Cmp,
    Not,
    Profile,
    Segment,
    load_segments,
    parse_segment,
)
from engagement_platform.profiles.segments.reference import members
from engagement_platform.profiles.segments.task import TenantWork, evaluation_task
from engagement_platform.profiles.tables import RAW_SCHEMA
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.slices import TableVersionsSlice
from engagement_platform_tests.profiles.segments.test_evaluate import (
    NOW,
    array_cmps,
    array_items,
    elements,
    one_pass,
    profiles_for,
    record_cmps,
)

MISSING = object()  # the payload has no `tags` key at all


def row(pid: str, tags, hours: int = 1, record_type: str = "person") -> dict:
    fields = {} if tags is MISSING else {"tags": tags}
    return {
        "primary_id": pid,
        "record_type": record_type,
        "cdc_ts": NOW - timedelta(hours=hours),
        "fields": json.dumps(fields),
    }


def selects(cmp: Cmp, tags) -> bool:
    """Whether a record whose `tags` is `tags` satisfies `cmp`, by both evaluators (which must agree)."""
    segment = Segment("s", "", Aggregate("exists", cmp, None, None, ">=", 1), "test")
    identities = {"c": [row("p", tags)]}
    fast, slow = bool(one_pass(identities, [segment])), members(segment, identities, NOW) == {"c"}
    assert fast == slow, (cmp, tags)
    return fast


VALUES = {
    "gold list": ["gold", "silver"],
    "duplicates": ["gold", "gold"],
    "number one": [1],
    "float one": [1.0],
    "text one": ["1"],
    "true": [True],
    "null element": [None],
    "nested": [["gold"], {"gold": 1}],
    "empty": [],
    "scalar gold": "gold",
    "json null": None,
    "missing": MISSING,
}


@pytest.mark.parametrize(
    "cmp, chosen",
    [
        (Cmp("fields.tags", "has", "gold"), {"gold list", "duplicates"}),
        (Cmp("fields.tags", "has", 1), {"number one", "float one"}),  # 1 == 1.0; not "1", not true
        (Cmp("fields.tags", "has", "1"), {"text one"}),
        (Cmp("fields.tags", "has", True), {"true"}),
        (Cmp("fields.tags", "has_any", ("silver", 1)), {"gold list", "number one", "float one"}),
        (Cmp("fields.tags", "has_all", ("gold", "silver")), {"gold list"}),
        (Cmp("fields.tags", "has_all", ("gold", "gold")), {"gold list", "duplicates"}),  # a set of wanted elements
        (Cmp("fields.tags", "size=", 0), {"empty"}),  # not a missing path, not a scalar
        (Cmp("fields.tags", "size>=", 2), {"gold list", "duplicates", "nested"}),  # duplicates count
        (Cmp("fields.tags", "size=", 1), {"number one", "float one", "text one", "true", "null element"}),
        (Cmp("fields.tags", "size!=", 1), {"gold list", "duplicates", "nested", "empty"}),
        (Cmp("fields.tags", "size<", 1), {"empty"}),
        (Cmp("fields.tags", "contains", "gold"), {"scalar gold"}),  # a string op: false on an array
        (Cmp("fields.tags", "=", "gold"), {"scalar gold"}),
        (Cmp("fields.tags", "exists", None), set(VALUES) - {"json null", "missing"}),
    ],
)
def test_each_op_on_every_kind_of_value(cmp, chosen):
    assert {name for name, tags in VALUES.items() if selects(cmp, tags)} == chosen


def test_not_has_selects_what_has_does_not_missing_values_included():
    has = Cmp("fields.tags", "has", "gold")
    assert {name for name, tags in VALUES.items() if selects(has, tags)} == {"gold list", "duplicates"}
    identities = {name: [row("p", tags)] for name, tags in VALUES.items()}
    segment = Segment("not_gold", "", Not(Aggregate("exists", has, None, None, ">=", 1)), "test")
    expected = set(VALUES) - {"gold list", "duplicates"}
    assert {k for k, _ in one_pass(identities, [segment])} == expected == members(segment, identities, NOW)


def test_profile_has_reads_the_newest_record_that_has_the_path():
    segment = Segment("gold_now", "", Profile(Cmp("fields.tags", "has", "gold")), "test")
    identities = {
        "gold_newest": [row("a", ["silver"], hours=5), row("b", ["gold"], hours=1)],
        "gold_before": [row("c", ["gold"], hours=5), row("d", ["silver"], hours=1)],
        "newest_lacks_tags": [row("e", ["gold"], hours=5), row("f", MISSING, hours=1)],
    }
    expected = {"gold_newest", "newest_lacks_tags"}
    assert {k for k, _ in one_pass(identities, [segment])} == expected == members(segment, identities, NOW)


def test_the_array_ops_read_from_yaml(tmp_path):
    (tmp_path / "all").mkdir()
    (tmp_path / "all" / "cart.yaml").write_text("""
name: photoshop_in_a_big_cart
description: Added Photoshop into the cart, with at least two other products, and consented to email.
where:
  all:
    - exists: {where: {all: [{path: record_type, op: "=", value: cart_add}, {path: fields.cart, op: has, value: Photoshop}]}, within: 7d}
    - profile: {path: fields.cart, op: size>=, value: 3}
    - profile: {path: fields.consents, op: has_all, value: [email, tracking]}
    - not: {exists: {where: {path: fields.tags, op: has_any, value: [test, internal, 1]}}}
""")
    (segment,) = load_segments(tmp_path, "acme")
    assert segment.where == AllOf(
        (
            Aggregate(
                "exists",
                AllOf((Cmp("record_type", "=", "cart_add"), Cmp("fields.cart", "has", "Photoshop"))),
                7 * 86400.0,
                None,
                ">=",
                1,
            ),
            Profile(Cmp("fields.cart", "size>=", 3)),
            Profile(Cmp("fields.consents", "has_all", ("email", "tracking"))),
            Not(Aggregate("exists", Cmp("fields.tags", "has_any", ("test", "internal", 1)), None, None, ">=", 1)),
        )
    )

    def cart(pid, products, consents, hours=1):
        fields = {"cart": products, "consents": consents}
        return {**row(pid, MISSING, hours, "cart_add"), "fields": json.dumps(fields)}

    identities = {
        "in": [cart("a", ["Photoshop", "Lightroom", "Acrobat"], ["email", "tracking", "sms"])],
        "small_cart": [cart("b", ["Photoshop"], ["email", "tracking"])],
        "no_consent": [cart("c", ["Photoshop", "Lightroom", "Acrobat"], ["email"])],
        "too_old": [cart("d", ["Photoshop", "Lightroom", "Acrobat"], ["email", "tracking"], hours=24 * 8)],
    }
    assert one_pass(identities, [segment]) == [("in", "photoshop_in_a_big_cart")]
    assert members(segment, identities, NOW) == {"in"}


@pytest.mark.parametrize(
    "cmp, at, problem",
    [
        ({"path": "record_type", "op": "has", "value": "x"}, "where.profile.op", "record_type never holds one"),
        ({"path": "fields.tags", "op": "has", "value": ["a"]}, "where.profile.value", "use has_any or has_all"),
        ({"path": "fields.tags", "op": "has_any", "value": "a"}, "where.profile.value", "a non-empty list"),
        ({"path": "fields.tags", "op": "has_all", "value": []}, "where.profile.value", "a non-empty list"),
        ({"path": "fields.tags", "op": "has_all", "value": [None]}, "where.profile.value", "not None"),
        ({"path": "fields.tags", "op": "has", "value": {"a": 1}}, "where.profile.value", "a string, a number"),
        ({"path": "fields.tags", "op": "size>=", "value": -1}, "where.profile.value", "a whole number >= 0"),
        ({"path": "fields.tags", "op": "size=", "value": "2"}, "where.profile.value", "a whole number >= 0"),
        ({"path": "fields.tags", "op": "size=", "value": True}, "where.profile.value", "a whole number >= 0"),
        ({"path": "fields.tags", "op": "has"}, "where.profile", "'has' needs a value"),
        ({"path": "fields.tags", "op": "size", "value": 2}, "where.profile.op", "unknown operator 'size'"),
    ],
)
def test_a_bad_array_condition_names_the_file_the_path_and_the_problem(cmp, at, problem):
    _, problems = parse_segment({"name": "bad", "where": {"profile": cmp}}, "f.yaml")
    assert len(problems) == 1 and problems[0].startswith(f"f.yaml: {at}: ") and problem in problems[0], problems


def test_a_yaml_date_is_no_element_a_quoted_one_is(tmp_path):
    _, problems = parse_segment(
        {"name": "bad", "where": {"profile": {"path": "fields.days", "op": "has", "value": NOW.date()}}}, "f"
    )
    assert problems and "not datetime.date" in problems[0]
    segment, problems = parse_segment(
        {"name": "ok", "where": {"profile": {"path": "fields.days", "op": "has", "value": "2026-02-01"}}}, "f"
    )
    assert problems == [] and segment.where == Profile(Cmp("fields.days", "has", "2026-02-01"))


# Payloads dense in arrays: `tags` is an array most of the time, else a scalar, a JSON null or missing.
dense_tags = st.one_of(
    st.lists(array_items, max_size=5),
    st.lists(array_items, max_size=5),
    elements,
    st.none(),
    st.just(MISSING),
)
dense_rows = st.builds(
    lambda pid, hours, tags: row(pid, tags, hours),
    st.sampled_from(["u1", "u2"]),
    st.integers(0, 48),
    dense_tags,
)
array_conds = st.recursive(
    st.one_of(array_cmps.map(lambda c: Cmp("fields.tags", c.op, c.value)), record_cmps),
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: AllOf(tuple(xs))),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: AnyOf(tuple(xs))),
        inner.map(Not),
    ),
    max_leaves=4,
)
array_segments = st.one_of(
    array_conds.map(lambda c: Aggregate("exists", c, None, None, ">=", 1)),
    array_conds.map(lambda c: Aggregate("count", c, 86400.0, None, ">=", 2)),
    array_cmps.map(lambda c: Profile(Cmp("fields.tags", c.op, c.value))),
)


def arrays_read_as_one_value(identities: dict[str, list[dict]], segments: list[Segment]) -> dict[str, int]:
    """The warning's count, obviously: per path a scalar op reads, the records whose payload holds a list there."""
    counts = {}
    for path in scalar_reads(segments):
        held = 0
        for rows in identities.values():
            for r in rows:
                node = json.loads(r["fields"]) if r.get("fields") else None
                for key in path.split(".")[1:]:
                    node = node.get(key) if isinstance(node, dict) else None
                held += isinstance(node, list)
        if held:
            counts[path] = held
    return counts


@settings(max_examples=300, deadline=None)
@given(
    st.lists(array_segments, min_size=1, max_size=5),
    st.dictionaries(st.sampled_from(["c1", "c2", "c3"]), st.lists(dense_rows, min_size=1, max_size=4)),
)
def test_one_pass_equals_the_reference_on_array_payloads_and_counts_arrays_read_as_one_value(conditions, identities):
    segments = [Segment(f"s{i}", "", c, "test") for i, c in enumerate(conditions)]
    got = one_pass(identities, segments)
    expected = {(key, s.name) for s in segments for key in members(s, identities, NOW)}
    assert set(got) == expected and len(got) == len(expected)
    assert array_rows(profiles_for(identities, segments), segments) == arrays_read_as_one_value(identities, segments)


CONTAINS_GOLD = Segment(
    "gold_text", "", Aggregate("exists", Cmp("fields.tags", "contains", "gold"), None, None, ">=", 1), "test"
)
HAS_GOLD = Segment("gold", "", Aggregate("exists", Cmp("fields.tags", "has", "gold"), None, None, ">=", 1), "test")
MAX_TAGS = Segment("max_tags", "", Aggregate("max", None, None, "fields.tags", ">=", 2), "test")


def test_a_scalar_op_on_a_path_that_held_arrays_is_a_warning_with_the_count():
    identities = {
        "a": [row("p1", ["gold"]), row("p2", ["gold", "silver"])],
        "b": [row("p3", "gold"), row("p4", MISSING)],
    }
    segments = [CONTAINS_GOLD, HAS_GOLD, MAX_TAGS]
    held = array_rows(profiles_for(identities, segments), segments)
    assert held == {"fields.tags": 2}
    (warning,) = array_warnings(segments, held)
    assert warning.startswith("fields.tags held an array in 2 of the records evaluated")
    assert "gold_text (contains), max_tags (max >=) compare it as one value" in warning and "has_any" in warning
    # the array ops alone read arrays as arrays: no warning
    assert array_rows(profiles_for(identities, [HAS_GOLD]), [HAS_GOLD]) == {}
    # scalars only: no warning either
    assert array_rows(profiles_for({"b": identities["b"]}, segments), segments) == {}


def test_the_task_hands_the_count_back_and_the_run_s_metadata_carries_the_warning(tmp_path):
    """The Spark task's function runs here over a local Parquet file (no Spark, no stack): the count travels
    in its hand-back to the driver's per-tenant split, and into the result's metadata."""
    raws = [
        {**row("p1", ["gold"]), "component_id": "p1"},
        {**row("p2", ["silver", "gold"]), "component_id": "p2"},
        {**row("p3", "gold"), "component_id": "p3"},
    ]
    pq.write_table(pa.Table.from_pylist([{**r, "tenant": "acme"} for r in raws], schema=RAW_SCHEMA), tmp_path / "raw")
    segments = (CONTAINS_GOLD, HAS_GOLD)
    work = TenantWork(
        tenant="acme",
        batch_id=1,
        segments=segments,
        now=NOW,
        raw_files=(str(tmp_path / "raw"),),
        base_files=(),
        log_files=(),
        through=-1,
        changes_uri=str(tmp_path / "c"),
        raw_version=0,
        tag="t",
        write_changes=False,
    )
    out: dict[str, list[pa.Table]] = {}
    for batch in evaluation_task([work], None)(iter([pa.record_batch([pa.array([0])], names=["id"])])):
        kind, payload = batch.column(0)[0].as_py(), batch.column(1)[0].as_py()
        out.setdefault(kind, []).append(pa.ipc.open_stream(payload).read_all())
    handed = handed_by_tenant({kind: pa.concat_tables(tables) for kind, tables in out.items()})["acme"]
    assert handed.array_records == {"fields.tags": 2}
    assert handed.sizes == {"gold_text": 1, "gold": 2}
    result = SegmentResult(
        BatchPlan("profile_segments/acme", 1, TableVersionsSlice("raw", -1, 0)),
        "acme",
        len(segments),
        handed.counts["identities"],
        handed.counts["members"],
        handed.counts["entered"],
        handed.counts["exited"],
        {},
        handed.sizes,
        array_records=handed.array_records,
        warnings=array_warnings(list(segments), handed.array_records),
    )
    meta = result.metadata()
    assert meta["array_records_fields.tags"] == 2 and meta["size_gold"] == 2
    (warning,) = meta["warnings"]
    assert warning.startswith("fields.tags held an array in 2 of the records evaluated, and segments gold_text")
