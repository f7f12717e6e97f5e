"""The table cache on real Delta tables: a kept answer is exactly what a fresh read returns, after commits by other
writers (another process too), to other partitions, past a log cleanup, after the lake is reset; an unchanged
table is not read again; which commits reach which partitions, against an obviously correct reference."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError
from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.lake import table_cache
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.table_cache import PartitionScope, TableCache, Touched, commit_touches

TABLE = "events"
STREAMS = ("a", "b", "c")


def append(lake: DeltaLake, stream: str, n: int, start: int = 0) -> None:
    """A commit of `n` rows to `stream`'s partition, by a writer the cache knows nothing of."""
    rows = pa.table({"stream": [stream] * n, "seq": list(range(start, start + n))})
    write_deltalake(lake.uri(TABLE), rows, mode="append", partition_by=["stream"], storage_options=lake.storage_options)


def fresh(lake: DeltaLake, streams: tuple[str, ...]) -> list[tuple[str, int]]:
    """The reference: a read of the table as it is now, in a canonical order."""
    try:
        rows = lake.read(TABLE, filters=[("stream", "in", list(streams))])
    except TableNotFoundError:
        return []
    return sorted(zip(rows["stream"].to_pylist(), rows["seq"].to_pylist()))


class Counting:
    """What the cache is asked to compute, with a count of the reads it did."""

    def __init__(self, lake: DeltaLake, cache: TableCache):
        self.lake, self.cache, self.reads = lake, cache, 0

    def rows(self, *streams: str) -> list[tuple[str, int]]:
        def read() -> list[tuple[str, int]]:
            self.reads += 1
            return fresh(self.lake, streams)

        return self.cache.answer(
            self.lake, TABLE, ("rows", streams), read, PartitionScope("stream", frozenset(streams))
        )

    def total(self) -> int:
        def read() -> int:
            self.reads += 1
            return len(fresh(self.lake, STREAMS))

        return self.cache.memo(self.lake, [TABLE], "total", read)


@pytest.mark.lake_stores("local", "s3")
def test_a_commit_by_another_writer_is_read_and_an_unchanged_table_is_not(lake):
    append(lake, "a", 2)
    cached = Counting(lake, TableCache())
    assert cached.rows("a") == [("a", 0), ("a", 1)] and cached.reads == 1
    assert cached.rows("a") == [("a", 0), ("a", 1)] and cached.reads == 1, "unchanged: not read again"
    assert cached.total() == 2 and cached.total() == 2 and cached.reads == 2

    append(lake, "a", 1, start=2)  # another writer
    assert cached.rows("a") == fresh(lake, ("a",)) == [("a", 0), ("a", 1), ("a", 2)] and cached.reads == 3
    assert cached.total() == 3 and cached.reads == 4

    append(lake, "b", 5)  # another stream's partition: a's answer is kept, the whole-table one is not
    assert cached.rows("a") == fresh(lake, ("a",)) and cached.reads == 4
    assert cached.total() == 8 and cached.reads == 5
    assert (
        cached.cache.version(lake, TABLE) == DeltaTable(lake.uri(TABLE), storage_options=lake.storage_options).version()
    )


def test_a_commit_by_another_process_is_read(tmp_path):
    lake = DeltaLake(str(tmp_path / "lake"))
    append(lake, "a", 1)
    cached = Counting(lake, TableCache())
    assert cached.rows("a") == [("a", 0)]
    writer = (
        "import pyarrow as pa, sys; from deltalake import write_deltalake; "
        "write_deltalake(sys.argv[1], pa.table({'stream': ['a'], 'seq': [1]}), mode='append', partition_by=['stream'])"
    )
    subprocess.run([sys.executable, "-c", writer, lake.uri(TABLE)], check=True)
    assert cached.rows("a") == [("a", 0), ("a", 1)] and cached.reads == 2


def test_a_reset_lake_with_as_many_commits_is_read_again(tmp_path):
    lake = DeltaLake(str(tmp_path / "lake"))
    append(lake, "a", 1)
    append(lake, "a", 1, start=1)
    cached = Counting(lake, TableCache())
    assert cached.rows("a") == [("a", 0), ("a", 1)]
    assert cached.total() == 2
    shutil.rmtree(tmp_path / "lake")
    append(lake, "a", 3, start=10)  # versions 0 and 1 again, other rows: the kept version's commit file differs
    append(lake, "a", 3, start=20)
    assert cached.rows("a") == fresh(lake, ("a",)) and len(cached.rows("a")) == 6
    assert cached.total() == 6
    shutil.rmtree(tmp_path / "lake")
    assert cached.rows("a") == [] and cached.total() == 0, "no table: read, nothing kept"


def test_a_log_cleaned_up_past_the_kept_version_is_read_again(tmp_path):
    lake = DeltaLake(str(tmp_path / "lake"))
    append(lake, "a", 1)
    cached = Counting(lake, TableCache())
    assert cached.rows("b") == []
    for i in range(3):
        append(lake, "a", 1, start=i + 1)
    time.sleep(1.1)  # expire_log keeps commit files younger than a second
    lake.expire_log(TABLE, 1)  # a checkpoint at the newest version, every older commit file deleted
    assert not (tmp_path / "lake" / TABLE / "_delta_log" / f"{0:020d}.json").exists()
    append(lake, "b", 2)
    assert cached.rows("b") == [("b", 0), ("b", 1)] and cached.reads == 2


def test_a_log_that_moved_further_than_it_is_followed_is_read_again(tmp_path, monkeypatch):
    monkeypatch.setattr(table_cache, "MAX_FORWARD", 2)
    lake = DeltaLake(str(tmp_path / "lake"))
    append(lake, "a", 1)
    cached = Counting(lake, TableCache())
    assert cached.rows("a") == [("a", 0)]
    append(lake, "b", 1)
    append(lake, "b", 1)
    assert cached.rows("a") == [("a", 0)] and cached.reads == 1, "two commits elsewhere: followed"
    for _ in range(3):
        append(lake, "b", 1)
    assert cached.rows("a") == [("a", 0)] and cached.reads == 2, "three: a fresh read"


def test_threads_asking_at_once_get_the_fresh_answer(tmp_path):
    lake = DeltaLake(str(tmp_path / "lake"))
    append(lake, "a", 1)
    cached = Counting(lake, TableCache())
    answers: list[list[tuple[str, int]]] = []

    def ask() -> None:
        for _ in range(20):
            answers.append(cached.rows("a"))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    append(lake, "a", 1, start=1)
    for t in threads:
        t.join()
    assert all(a in ([("a", 0)], [("a", 0), ("a", 1)]) for a in answers)
    assert cached.rows("a") == [("a", 0), ("a", 1)]


def test_a_forked_child_starts_empty():
    cache = TableCache()
    lake = DeltaLake(tempfile.mkdtemp())
    append(lake, "a", 1)
    assert Counting(lake, cache).rows("a") == [("a", 0)]
    cache.after_fork()
    again = Counting(lake, cache)
    assert again.rows("a") == [("a", 0)] and again.reads == 1


# ---- against a reference --------------------------------------------------------------------------

Step = tuple[str, str]  # ("append", stream) | ("ask", streams joined) | ("total", "")
steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.sampled_from(STREAMS)),
        st.tuples(st.just("ask"), st.sampled_from(["a", "b", "ab", "bc"])),
        st.tuples(st.just("total"), st.just("")),
    ),
    max_size=10,
)


@settings(max_examples=25, deadline=None)
@given(steps)
def test_every_answer_is_what_a_fresh_read_returns(plan: list[Step]):
    with tempfile.TemporaryDirectory() as root:
        lake = DeltaLake(root)
        cached = Counting(lake, TableCache())
        seq = 0
        for kind, arg in plan:
            if kind == "append":
                append(lake, arg, 1, start=seq)
                seq += 1
            elif kind == "ask":
                assert cached.rows(*arg) == fresh(lake, tuple(arg))
            else:
                assert cached.total() == len(fresh(lake, STREAMS))


def reaches_reference(commits: list[list[dict]], column: str, values: frozenset[str]) -> bool:
    """Whether any action of the commits may change what `values`' partitions hold, by the Delta protocol's
    definitions: only commitInfo, txn, cdc and domainMetadata change no data file, schema or protocol."""
    for actions in commits:
        for action in actions:
            ((kind, body),) = action.items()
            if kind in ("commitInfo", "txn", "cdc", "domainMetadata"):
                continue
            if kind not in ("add", "remove") or "partitionValues" not in body:
                return True
            if column not in body["partitionValues"] or body["partitionValues"][column] in values:
                return True
    return False


partition_values = st.dictionaries(st.sampled_from(["stream", "org"]), st.sampled_from(["a", "b", None]), max_size=2)
file_action = st.builds(
    lambda kind, values, with_values: {
        kind: {"path": "f.parquet", **({"partitionValues": values} if with_values else {})}
    },
    st.sampled_from(["add", "remove"]),
    partition_values,
    st.booleans(),
)
other_action = st.sampled_from(
    [
        {"commitInfo": {"operation": "WRITE"}},
        {"txn": {"appId": "x", "version": 3}},
        {"cdc": {"path": "c.parquet", "partitionValues": {"stream": "a"}}},
        {"domainMetadata": {"domain": "d", "configuration": "{}", "removed": False}},
        {"metaData": {"id": "t", "partitionColumns": ["stream"]}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.one_of(file_action, other_action), max_size=4), max_size=3),
    st.frozensets(st.sampled_from(["a", "b"]), min_size=1),
)
def test_commits_reach_a_partition_as_the_protocol_says(commits: list[list[dict]], values: frozenset[str]):
    touched = Touched()
    for actions in commits:
        commit_touches("\n".join(json.dumps(a) for a in actions).encode() + b"\n", touched)
    assert touched.reaches(PartitionScope("stream", values)) == reaches_reference(commits, "stream", values)
