"""A config-owned table (a pipeline's target) brought to its config's schema when a writer opens it: a new column
is added and older rows read null (through deltalake, DuckDB and the executors' file reader); a dropped column, a
changed type or changed partitioning is refused, naming the pipeline, the column and the table. No servers."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec
from engagement_platform.lake.file_writes import WrittenFile, read_file
from engagement_platform.lake.schema_evolution import REQUIRED_KEY, SchemaChangeError, evolve, with_stored_columns
from engagement_platform_tests.support.duckdb_reader import read_delta

REQUIRED, OPTIONAL = {REQUIRED_KEY: "true"}, {REQUIRED_KEY: "false"}
V1 = TableSpec(
    name="members",
    schema=pa.schema(
        [
            pa.field("member_id", pa.int64(), metadata=REQUIRED),
            pa.field("store", pa.string(), metadata=REQUIRED),
            pa.field("points", pa.int32(), metadata=OPTIONAL),
        ]
    ),
    partition_by=("store",),
    config_owner="pipeline members",
)
V2 = replace(V1, schema=V1.schema.append(pa.field("nickname", pa.string(), metadata=OPTIONAL)))


def rows(spec: TableSpec, ids: list[int], **extra) -> pa.Table:
    columns = {"member_id": ids, "store": ["s1"] * len(ids), "points": [1] * len(ids), **extra}
    return pa.table(columns).cast(pa.schema([spec.schema.field(n) for n in columns]))


@pytest.fixture
def lake(tmp_path) -> DeltaLake:
    lake = DeltaLake(str(tmp_path / "lake"))
    lake.append(V1, rows(V1, [1, 2]), BatchTxn("members", 1))
    return lake


def test_a_new_column_is_added_and_older_rows_read_null_everywhere(lake):
    lake.ensure_config_schema(V2)
    lake.append(V2, rows(V2, [3], nickname=["Cy"]), BatchTxn("members", 2))

    table = lake.table("members")
    assert table.schema().fields[-1].name == "nickname" and table.schema().fields[-1].nullable
    expected = [(1, None), (2, None), (3, "Cy")]
    read = lake.read("members").sort_by("member_id")
    assert list(zip(read["member_id"].to_pylist(), read["nickname"].to_pylist())) == expected
    by_duckdb = read_delta(lake.uri("members"), ["member_id", "nickname"])
    assert list(zip(by_duckdb["member_id"].to_pylist(), by_duckdb["nickname"].to_pylist())) == expected

    (older,) = [a for a in pa.table(table.get_add_actions(flatten=True)).to_pylist() if a["num_records"] == 2]
    written = WrittenFile(older["path"], older["size_bytes"], {"store": "s1"}, "{}", 0, rows=2)
    from_file = read_file(lake.uri("members"), V2, written)
    assert from_file.schema == V2.schema and from_file["nickname"].to_pylist() == [None, None]
    assert read_file(lake.uri("members"), V2, written, columns=["nickname", "member_id"]).column_names == [
        "nickname",
        "member_id",
    ]


def test_opening_with_the_same_schema_commits_nothing(lake):
    version = lake.table("members").version()
    lake.ensure_config_schema(V1)
    assert lake.table("members").version() == version


@pytest.mark.parametrize(
    "changed, named",
    [
        (
            replace(V1, schema=V1.schema.set(2, pa.field("points", pa.int64()))),
            "column 'points' is integer in the table and long",
        ),
        (
            replace(V1, schema=V1.schema.remove(0)),
            "column 'member_id' is in the table but not in the config, and it is required",
        ),
        (replace(V1, partition_by=()), "partitioned by ['store'], the config says []"),
    ],
    ids=["type", "dropped required", "partitioning"],
)
def test_a_change_the_table_cannot_take_is_refused_before_anything_is_written(lake, changed, named):
    version = lake.table("members").version()
    with pytest.raises(SchemaChangeError, match="^pipeline members: table 'members' cannot take") as refused:
        lake.ensure_config_schema(changed)
    assert named in str(refused.value)
    assert lake.table("members").version() == version and lake.read("members").num_rows == 2


def test_other_writers_take_the_table_as_it_is(lake):
    """An erasure or upkeep rewriting a pipeline's files opens its table with ensure(): a config change neither
    blocks it nor changes the table under it."""
    for changed in (V2, replace(V1, schema=V1.schema.remove(0))):
        assert lake.ensure(changed).schema() == lake.table("members").schema()
        assert [f.name for f in lake.table("members").schema().fields] == V1.schema.names


def test_two_writers_adding_the_same_column_both_end_with_it_once(lake):
    stale = lake.table("members")  # loaded before the other writer added the column
    lake.ensure_config_schema(V2)
    evolved = evolve(stale, V2, lambda: lake.table("members"))
    names = [f.name for f in DeltaTable(lake.uri("members")).schema().fields]
    assert names.count("nickname") == 1 and [f.name for f in evolved.schema().fields] == names


def test_an_optional_column_the_config_dropped_stays_and_an_erasure_keeps_its_values(lake):
    dropped = replace(V1, schema=V1.schema.remove(2))
    lake.ensure_config_schema(dropped)
    lake.append(dropped, rows(V1, [3]).drop_columns(["points"]), BatchTxn("members", 2))
    read = lake.read("members").sort_by("member_id")
    assert read["points"].to_pylist() == [1, 1, None], "new rows read null in the column the table keeps"

    stored = with_stored_columns(lake.table("members"), dropped)  # what an erasure rewrites the files with
    assert stored.schema.names == [*dropped.schema.names, "points"]
    (older,) = [
        a for a in pa.table(lake.table("members").get_add_actions(flatten=True)).to_pylist() if a["num_records"] == 2
    ]
    written = WrittenFile(older["path"], older["size_bytes"], {"store": "s1"}, "{}", 0, rows=2)
    assert read_file(lake.uri("members"), stored, written)["points"].to_pylist() == [1, 1]


def test_a_table_that_does_not_record_optional_columns_refuses_any_dropped_column(tmp_path):
    plain = replace(V1, schema=pa.schema([(f.name, f.type) for f in V1.schema]))  # created before tables recorded it
    lake = DeltaLake(str(tmp_path / "lake"))
    lake.ensure(plain)
    with pytest.raises(SchemaChangeError, match="column 'points' .* does not record whether it is optional"):
        lake.ensure_config_schema(replace(V1, schema=V1.schema.remove(2)))
