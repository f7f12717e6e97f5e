"""Commits over concurrent commits to other partitions, on real local Delta tables: retried when the winners
touched other partitions only, refused when they touched this commit's partitions or the table is unpartitioned."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, RemoveAction

from engagement_platform.lake.file_writes import filesystem
from engagement_platform.lake.partition_commits import commit_over_other_partitions, partitions_touched

ROWS = pa.table({"tenant": ["a", "a", "b", "c"], "value": [1, 2, 3, 4]})


def make_table(path: str, partition_by: list[str] | None) -> None:
    write_deltalake(path, ROWS, partition_by=partition_by)


def removes_of(table: DeltaTable, tenant: str) -> list[RemoveAction]:
    files = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    now = int(time.time() * 1000)
    return [
        RemoveAction(f["path"], True, now, f["size_bytes"], {"tenant": f.get("partition.tenant")})
        for f in files
        if f.get("partition.tenant", "a") == tenant
    ]


def commit(stale: DeltaTable, path: str, actions, partition_by) -> None:
    fs, root = filesystem(path)
    commit_over_other_partitions(
        stale,
        fs,
        f"{root}/_delta_log",
        actions,
        schema=ROWS.schema,
        partition_by=partition_by,
        commit_properties=CommitProperties(),
        committed=lambda: False,
    )


def tenants(path: str) -> list[str]:
    return sorted(pa.table(DeltaTable(path).to_pyarrow_table())["tenant"].to_pylist())


def test_a_commit_beaten_by_a_commit_to_another_partition_commits_on_top_of_it(tmp_path) -> None:
    path = str(tmp_path / "t")
    make_table(path, ["tenant"])
    stale = DeltaTable(path)  # writer A read version 0
    plain = DeltaTable(path)
    DeltaTable(path).delete("tenant = 'b'")  # writer B removes its own tenant's files first
    with pytest.raises(CommitFailedError, match="concurrent transaction deleted data"):
        plain.create_write_transaction(
            removes_of(plain, "a"), mode="append", schema=ROWS.schema, partition_by=["tenant"]
        )  # delta-rs alone refuses A's commit, though it touches another partition
    commit(stale, path, removes_of(stale, "a"), ["tenant"])  # A removes tenant a's files
    assert tenants(path) == ["c"], "both writers' removes hold"
    assert DeltaTable(path).version() == 2


def test_a_commit_beaten_by_a_commit_to_its_own_partition_is_refused(tmp_path) -> None:
    path = str(tmp_path / "t")
    make_table(path, ["tenant"])
    stale = DeltaTable(path)
    DeltaTable(path).delete("tenant = 'a' AND value = 1")  # another writer rewrote a file of tenant a
    with pytest.raises(CommitFailedError):
        commit(stale, path, removes_of(stale, "a"), ["tenant"])
    assert tenants(path) == ["a", "b", "c"], "nothing of the refused commit is in the table"


def test_an_unpartitioned_table_is_never_retried(tmp_path) -> None:
    path = str(tmp_path / "t")
    make_table(path, None)
    stale = DeltaTable(path)
    DeltaTable(path).delete("value = 4")
    with pytest.raises(CommitFailedError):
        commit(stale, path, removes_of(stale, "a"), [])


def line(kind: str, body: dict) -> bytes:
    return json.dumps({kind: body}).encode()


def test_partitions_touched_reads_file_actions_and_refuses_anything_else() -> None:
    add = line("add", {"path": "x", "partitionValues": {"tenant": "a", "day": "1"}})
    remove = line("remove", {"path": "y", "partitionValues": {"tenant": None}})
    info = line("commitInfo", {"operation": "WRITE"})
    txn = line("txn", {"appId": "s", "version": 3})
    assert partitions_touched(b"\n".join([info, txn, add, remove]), "tenant") == {"a", None}
    assert partitions_touched(b"\n".join([info, txn]), "tenant") == set()
    assert partitions_touched(line("metaData", {"id": "m"}), "tenant") is None
    assert partitions_touched(line("protocol", {"minReaderVersion": 1}), "tenant") is None
    assert partitions_touched(line("add", {"path": "z", "partitionValues": {}}), "tenant") is None
