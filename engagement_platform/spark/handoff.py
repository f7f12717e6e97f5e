"""What Spark tasks hand back to the driver besides rows: small Arrow tables (file actions, keys, error
rows) serialized as Arrow IPC inside the rows of a two-column frame, so one Spark job can write data
files on the executors and still return everything the driver commits or checks."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

import pyarrow as pa
from pyspark.sql import DataFrame

HANDOFF_SCHEMA = "kind string, payload binary"
T = TypeVar("T")
CHUNK_ROWS = 100_000  # rows per payload: keeps each Arrow message far below Spark Connect's size limit


def handoff(kind: str, table: pa.Table) -> Iterator[pa.RecordBatch]:
    """`table` as handoff rows of `kind` (at least one, so the driver learns the schema of an empty table)."""
    for start in range(0, max(table.num_rows, 1), CHUNK_ROWS):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(start, CHUNK_ROWS))
        yield pa.RecordBatch.from_arrays(
            [pa.array([kind]), pa.array([sink.getvalue().to_pybytes()], pa.binary())], names=["kind", "payload"]
        )


def collect_handoff(frame: DataFrame) -> dict[str, pa.Table]:
    """kind -> the concatenated tables every task handed back (a kind no task produced is missing)."""
    rows = frame.toArrow()
    parts: dict[str, list[pa.Table]] = {}
    for kind, payload in zip(rows["kind"].to_pylist(), rows["payload"].to_pylist()):
        parts.setdefault(kind, []).append(pa.ipc.open_stream(payload).read_all())
    return {kind: pa.concat_tables(tables) for kind, tables in parts.items()}


def dealt(items: Sequence[T], tasks: int) -> list[list[T]]:
    """Items dealt round-robin to at most `tasks` Spark tasks, none empty (one empty share when there are none):
    task i of spark.range(len(shares)) takes shares[i]."""
    count = max(1, min(tasks, len(items)))
    return [list(items[i::count]) for i in range(count)]
