"""Current segment membership, merged on read from the compacted base and the change log (pure: no Spark, no I/O).

Membership is kept the way Hudi keeps a merge-on-read table: `profile_segments` is a base that only a
compaction rewrites, `profile_segment_changes` an append-only log of entries and exits that every evaluation
adds to. A (segment, identity) pair is a member when its newest row, by batch, is a base row or an entry.

Why the newest row decides, without knowing which batch the base was compacted through: a base row carries
the batch in which its pair entered, and the log holds every change of every batch, so the newest row of a
pair is either that entry (the base and the log agree), a later change the base has not folded in yet, or,
for a pair the base does not hold, the exit that took it out. A reader that knows the compaction point
(`through`) only skips log files it does not need; the answer is the same.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BASE_COLUMNS = ["segment", "identity", "entered_at", "batch_id"]
LOG_COLUMNS = ["segment", "identity", "change", "evaluated_at", "batch_id"]
ENTERED, EXITED = "entered", "exited"
_TS = pa.timestamp("us", tz="UTC")


CODES = pa.dictionary(pa.int32(), pa.string())  # strings as codes into their distinct values


def encoded(values: pa.ChunkedArray | pa.Array) -> pa.DictionaryArray:
    """One dictionary-encoded array: codes a reader already has are kept (their dictionaries unified), other
    strings are encoded."""
    if pa.types.is_dictionary(values.type):
        unified = values.unify_dictionaries() if isinstance(values, pa.ChunkedArray) else values
        return unified.combine_chunks() if isinstance(unified, pa.ChunkedArray) else unified
    array = pc.dictionary_encode(values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values)
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array


def _joined(*columns: pa.ChunkedArray) -> pa.ChunkedArray:
    """The columns' strings as one column: still encoded when every one comes encoded, else plain."""
    kind = CODES if all(pa.types.is_dictionary(c.type) for c in columns) else pa.string()
    return pa.chunked_array([chunk for c in columns for chunk in c.cast(kind).chunks], kind)


def ranks(codes: pa.DictionaryArray) -> np.ndarray:
    """Each value's position in the sorted distinct values (int64): equal values get equal codes, and codes
    order as the strings do."""
    # dense: a value that occurs twice in the dictionary still gets one code
    order = np.asarray(pc.rank(codes.dictionary, sort_keys="ascending", tiebreaker="dense").to_numpy(), np.int64) - 1
    return order[np.asarray(codes.indices.to_numpy(zero_copy_only=False), np.int64)]


def _take(codes: pa.DictionaryArray, chosen: pa.Array) -> pa.Array:
    """Chosen rows of a dictionary-encoded string column, as plain strings: the codes are taken, then decoded
    (several times cheaper than taking rows of a large string column in random order)."""
    return pa.DictionaryArray.from_arrays(codes.indices.take(chosen), codes.dictionary).cast(pa.string())


def current_membership(base: pa.Table, log: pa.Table, as_of_batch: int | None = None) -> pa.Table:
    """The members (BASE_COLUMNS, sorted by identity then segment) given base rows (BASE_COLUMNS) and log rows
    (LOG_COLUMNS) of one tenant. `as_of_batch`: the membership right after that batch (the base must then be
    compacted through at most that batch, or be left out with the whole log given)."""
    base = base.select(BASE_COLUMNS)
    log = log.select(LOG_COLUMNS)
    if as_of_batch is not None:
        base = base.filter(pc.less_equal(base["batch_id"], as_of_batch))
        log = log.filter(pc.less_equal(log["batch_id"], as_of_batch))
    rows = pa.table(
        {
            "segment": _joined(base["segment"], log["segment"]),
            "identity": _joined(base["identity"], log["identity"]),
            "entered_at": pa.chunked_array(
                [*base["entered_at"].cast(_TS).chunks, *log["evaluated_at"].cast(_TS).chunks], _TS
            ),
            "batch_id": pa.chunked_array(
                [*base["batch_id"].cast(pa.int64()).chunks, *log["batch_id"].cast(pa.int64()).chunks], pa.int64()
            ),
        }
    )
    if not rows.num_rows:
        return rows.cast(
            pa.schema(
                [
                    (c, pa.string() if c in ("segment", "identity") else rows.schema.field(c).type)
                    for c in rows.column_names
                ]
            )
        )
    member = np.concatenate(
        [
            np.ones(base.num_rows, bool),
            np.asarray(pc.equal(log["change"], ENTERED).fill_null(False).to_numpy(zero_copy_only=False), bool),
        ]
    )
    segments, identities = encoded(rows["segment"]), encoded(rows["identity"])
    segment, identity = ranks(segments), ranks(identities)
    key = identity * (int(segment.max()) + 1) + segment
    batch = np.asarray(rows["batch_id"].to_numpy(), np.int64)
    order = np.lexsort((batch, key))  # by pair, then by batch: a pair's newest row is the last of its run
    last = np.ones(len(order), bool)
    last[:-1] = key[order][1:] != key[order][:-1]
    newest = order[last]
    chosen = pa.array(newest[member[newest]])
    return pa.table(
        {
            "segment": _take(segments, chosen),
            "identity": _take(identities, chosen),
            "entered_at": rows["entered_at"].combine_chunks().take(chosen),
            "batch_id": rows["batch_id"].combine_chunks().take(chosen),
        }
    )


def net_sizes(base_segments: pa.ChunkedArray | pa.Array, log: pa.Table) -> dict[str, int]:
    """Members per segment when the base holds exactly the state the log's rows change: base rows count one,
    an entry one more, an exit one less (the log here is only the rows after the base's compaction point)."""
    sizes: dict[str, int] = {}
    for values, weight in (
        (base_segments, 1),
        (log["segment"].filter(pc.equal(log["change"], ENTERED)), 1),
        (log["segment"].filter(pc.equal(log["change"], EXITED)), -1),
    ):
        counts = pc.value_counts(values.cast(pa.string()))
        for name, n in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()):
            sizes[name] = sizes.get(name, 0) + weight * n
    return sizes
