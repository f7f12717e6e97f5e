"""tenant_merge_source against the references: json_merge.resolve_changes per key, and the connected
components of the whole graph after the batch (identity.components_reference) for every row."""

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.profiles.identity import components_reference
from engagement_platform.profiles.json_merge import DELETE, UPSERT, Change, ProfileState, resolve_changes
from engagement_platform.profiles.processor.resolution import SOURCE_COLUMNS, merge_source
from engagement_platform.profiles.processor.tenant_merge import RELINK, tenant_merge_source
from engagement_platform.spark.handoff_files import new_handoff, sweep_handoffs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
IDS = [f"p{i}" for i in range(8)]
LINK_TARGETS = st.lists(st.sampled_from(IDS + ["x1", "x2"]), max_size=3)  # x*: ids no row has
SCALARS = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=4)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner, max_size=2),
    max_leaves=4,
)
OBJECTS = st.dictionaries(st.sampled_from(["email", "name", "tags", "score"]), VALUES, max_size=4)


def stored_table(states: dict[str, ProfileState]) -> tuple[pa.Table, dict[str, dict]]:
    """A consistent stored table: related_ids / component_id from the components of the stored links."""
    label = components_reference([(pid, x) for pid, s in states.items() for x in (pid, *s.linked_ids)])
    rows = {}
    for pid, s in states.items():
        root = label[pid]
        rows[pid] = dict(
            tenant="t",
            primary_id=pid,
            record_type=s.record_type,
            linked_ids=list(s.linked_ids),
            related_ids=sorted(x for x, r in label.items() if r == root),
            component_id=root,
            cdc_seq=s.seq,
            deleted=s.deleted,
            fields=None if s.fields is None else json.dumps(s.fields),
        )
    return pa.Table.from_pylist(list(rows.values()), schema=STORED), rows


STORED = pa.schema(
    [
        ("tenant", pa.string()),
        ("primary_id", pa.string()),
        ("record_type", pa.string()),
        ("linked_ids", pa.list_(pa.string())),
        ("related_ids", pa.list_(pa.string())),
        ("component_id", pa.string()),
        ("cdc_seq", pa.int64()),
        ("deleted", pa.bool_()),
        ("fields", pa.string()),
    ]
)
CHANGES = pa.schema(
    [
        ("tenant", pa.string()),
        ("primary_id", pa.string()),
        ("related_ids", pa.list_(pa.string())),
        ("record_type", pa.string()),
        ("op", pa.string()),
        ("cdc_seq", pa.int64()),
        ("cdc_ts", pa.timestamp("us", tz="UTC")),
        ("fields", pa.string()),
    ]
)

STATES = st.dictionaries(
    st.sampled_from(IDS),
    st.builds(
        lambda seq, deleted, fields, links, kind: ProfileState(
            seq, deleted, None if deleted else fields, () if deleted else tuple(links), kind
        ),
        st.integers(0, 10),
        st.booleans(),
        OBJECTS,
        LINK_TARGETS,
        st.sampled_from([None, "person", "account"]),
    ),
    max_size=6,
)
KEYED_CHANGES = st.lists(
    st.tuples(
        st.sampled_from(IDS),
        st.builds(
            lambda seq, op, fields, links, kind: Change(seq, op, fields, None if links is None else tuple(links), kind),
            st.integers(0, 20),
            st.sampled_from([UPSERT, UPSERT, DELETE]),
            OBJECTS | st.none(),
            st.none() | LINK_TARGETS,
            st.sampled_from([None, "person"]),
        ),
    ),
    max_size=14,
    unique_by=lambda kc: (kc[0], kc[1].seq),
)
CHANGES_DDL = (
    "tenant string, primary_id string, related_ids array<string>, record_type string, op string, cdc_seq bigint, "
    "cdc_ts timestamp, fields string"
)
STORED_DDL = (
    "tenant string, primary_id string, record_type string, linked_ids array<string>, related_ids array<string>, "
    "component_id string, cdc_seq bigint, deleted boolean, fields string"
)


def changes_table(keyed: list[tuple[str, Change]]) -> pa.Table:
    return pa.Table.from_pylist(
        [
            dict(
                tenant="t",
                primary_id=pid,
                related_ids=None if c.related_ids is None else list(c.related_ids),
                record_type=c.record_type,
                op=c.op,
                cdc_seq=c.seq,
                cdc_ts=T0 + timedelta(seconds=c.seq),
                fields=None if c.fields is None else json.dumps(c.fields),
            )
            for pid, c in keyed
        ],
        schema=CHANGES,
    )


@settings(max_examples=300, deadline=None)
@given(STATES, KEYED_CHANGES)
def test_source_rows_match_the_references(states, keyed):
    stored, rows = stored_table(states)
    source = tenant_merge_source(changes_table(keyed), stored).to_pylist()
    upserts = {r["primary_id"]: r for r in source if r["_action"] == "upsert"}
    assert len(upserts) == sum(r["_action"] == "upsert" for r in source)

    # 1. every key: the reference fold, or no row when nothing was newer than the stored row
    by_key: dict[str, list[Change]] = {}
    for pid, c in keyed:
        by_key.setdefault(pid, []).append(c)
    for pid, cs in by_key.items():
        expected = resolve_changes(states.get(pid), cs)
        if expected is None:
            assert pid not in upserts
            continue
        got = upserts[pid]
        assert (got["cdc_seq"], got["deleted"], got["record_type"]) == (
            expected.seq,
            expected.deleted,
            expected.record_type,
        )
        assert got["linked_ids"] == list(dict.fromkeys(expected.linked_ids))
        assert (None if got["fields"] is None else json.loads(got["fields"])) == expected.fields
        assert got["cdc_ts"] == T0 + timedelta(seconds=expected.seq)
    assert set(upserts) <= set(by_key)

    # 2. the MERGE applied: every row is labelled with its component in the whole graph after the batch
    for r in source:
        if r["_action"] == RELINK:
            assert r["primary_id"] in rows and r["primary_id"] not in upserts
            rows[r["primary_id"]].update(related_ids=r["related_ids"], component_id=r["component_id"])
        else:
            rows[r["primary_id"]] = r
    label = components_reference([(pid, x) for pid, r in rows.items() for x in (pid, *r["linked_ids"])])
    for pid, r in rows.items():
        root = label[pid]
        assert r["component_id"] == root
        assert r["related_ids"] == sorted(x for x, y in label.items() if y == root)


def test_a_link_joins_two_stored_components_and_relabels_both():
    states = {
        "a": ProfileState(1, linked_ids=("b",)),
        "b": ProfileState(1),
        "c": ProfileState(1, linked_ids=("d",)),
        "d": ProfileState(1),
    }
    stored, _ = stored_table(states)
    source = tenant_merge_source(
        changes_table([("e", Change(5, fields={"k": 1}, related_ids=("b", "c")))]), stored
    ).to_pylist()
    assert {r["primary_id"]: r["_action"] for r in source} == {
        "e": "upsert",
        "a": "relink",
        "b": "relink",
        "c": "relink",
        "d": "relink",
    }
    assert all(r["related_ids"] == ["a", "b", "c", "d", "e"] and r["component_id"] == "a" for r in source)


def test_fields_beyond_64_bit_integers_survive():
    stored, _ = stored_table({"a": ProfileState(1, fields={"n": 1})})
    changes = changes_table([("a", Change(2)), ("a", Change(3))]).set_column(
        7,
        "fields",
        pa.array(
            [
                '{"big": 123456789012345678901234567890, "f": 1e300}',
                '{"deep": {"x": [1, -98765432109876543210]}, "f": null}',  # nested; null keeps the older value
            ]
        ),
    )
    (row,) = tenant_merge_source(changes, stored).to_pylist()
    assert json.loads(row["fields"]) == {
        "n": 1,
        "big": 123456789012345678901234567890,
        "f": 1e300,
        "deep": {"x": [1, -98765432109876543210]},
    }


def test_fields_text_is_read_as_spark_validated_it():
    """Staging's check (strict from_json) takes what follows the object and lone escaped surrogates."""
    stored, _ = stored_table({"a": ProfileState(1, fields={"n": 1})})
    changes = changes_table([("a", Change(2)), ("a", Change(3))])
    changes = changes.set_column(7, "fields", pa.array(['{"x": 2} trailing', '{"s": "\\ud800"}']))
    (row,) = tenant_merge_source(changes, stored).to_pylist()
    assert json.loads(row["fields"]) == {"n": 1, "x": 2, "s": "\ud800"}


@settings(max_examples=3, deadline=None)
@given(st.dictionaries(st.sampled_from(["acme", "globex", "initech"]), st.tuples(STATES, KEYED_CHANGES), min_size=1))
def test_on_spark_every_tenant_gets_what_its_whole_table_would_give(spark, tenants):
    """resolution.merge_source (the stored-row pruning in Spark, the cogroup by tenant) against
    tenant_merge_source given each tenant's whole stored table."""
    changes, stored, expected = [], [], []
    for tenant, (states, keyed) in tenants.items():
        t_stored = stored_table(states)[0].set_column(0, "tenant", pa.array([tenant] * len(states), pa.string()))
        t_changes = changes_table(keyed).set_column(0, "tenant", pa.array([tenant] * len(keyed), pa.string()))
        changes.append(t_changes)
        stored.append(t_stored)
        expected += tenant_merge_source(t_changes, t_stored).to_pylist()
    staged_df = spark.createDataFrame(pa.concat_tables(changes).to_pandas(), CHANGES_DDL)
    raw_df = spark.createDataFrame(pa.concat_tables(stored).to_pandas(), STORED_DDL)
    got = merge_source(staged_df, raw_df).toArrow()
    assert got.column_names == list(SOURCE_COLUMNS)
    order = lambda r: (r["tenant"], r["primary_id"], r["_action"])  # noqa: E731
    assert sorted(got.to_pylist(), key=order) == sorted(expected, key=order)


def test_promoted_columns_come_from_the_merged_fields(spark):
    stored, _ = stored_table({"a": ProfileState(1, fields={"email": "old@x", "country": "DE"})})
    changes = changes_table([("a", Change(2, fields={"email": "new@x", "updated_at": "2026-01-05T10:06:59Z"}))])
    row = merge_source(
        spark.createDataFrame(changes.to_pandas(), CHANGES_DDL), spark.createDataFrame(stored.to_pandas(), STORED_DDL)
    ).collect()[0]
    assert (row["email"], row["country"], row["updated_at"]) == ("new@x", "DE", datetime(2026, 1, 5, 10, 6, 59))


def test_sweep_deletes_only_handoff_folders_older_than_the_limit(tmp_path):
    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    parent = tmp_path / "_handoff" / "profile_processor"
    stale = parent / Path(new_handoff(str(parent), now - timedelta(hours=25), "a")).name
    fresh = parent / Path(new_handoff(str(parent), now - timedelta(hours=1), "b")).name
    unnamed_stale, unnamed_fresh = parent / "c0ffee", parent / "facade"
    for folder in (stale, fresh, unnamed_stale, unnamed_fresh):
        folder.mkdir(parents=True)
        (folder / "tenant.arrow").write_bytes(b"x")
    old = (now - timedelta(hours=30)).timestamp()
    os.utime(unnamed_stale, (old, old))
    os.utime(unnamed_fresh, (now.timestamp(), now.timestamp()))
    (parent / "stray-file").write_bytes(b"y")

    swept = sweep_handoffs(str(parent), now, timedelta(hours=24))

    assert sorted(Path(p).name for p in swept) == sorted([stale.name, unnamed_stale.name])
    assert sorted(p.name for p in parent.iterdir()) == sorted([fresh.name, unnamed_fresh.name, "stray-file"])
    assert sweep_handoffs(str(tmp_path / "never-created"), now, timedelta(hours=24)) == []
