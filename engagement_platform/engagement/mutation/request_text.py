"""The canonical JSON text of mutation requests (`request_json`, how the request log and the pending
table store a request), written column by column with Arrow: keys sorted, nulls left out, request_time
in UTC with a `Z`, dates as ISO days, from_ids as a compact array, record as its canonical text.

A large batch is written by the driver's cores together: Arrow's kernels release the GIL, and on the
driver this is serial time between Spark jobs.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.mutation.request_columns import CANONICAL_SCHEMA, bool_mask

_TS = pa.timestamp("us", tz="UTC")


def _string_bytes(values: pa.ChunkedArray | pa.Array) -> list[np.ndarray]:
    """The UTF-8 data buffers of a string column as bytes (a sliced chunk's whole buffer: a superset)."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    buffers = [chunk.buffers()[2] for chunk in chunks]
    return [np.frombuffer(b, dtype=np.uint8) for b in buffers if b is not None and b.size]


def _json_string(values: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Each string as a JSON string literal (null stays null). Values with a quote or backslash are
    escaped with Arrow; the rare ones with control characters are written by json.dumps. Whether a
    column has any is one scan of its bytes: ids rarely do, and a regex per value cost more than the
    quoting itself."""
    data = _string_bytes(values)
    quoted = values
    if any(((b == 0x22) | (b == 0x5C)).any() for b in data):  # a quote or a backslash somewhere
        quoted = pc.replace_substring(pc.replace_substring(values, "\\", "\\\\"), '"', '\\"')
    quoted = pc.binary_join_element_wise('"', quoted, '"', "")
    if not any((b < 0x20).any() for b in data):
        return quoted
    control = bool_mask(pc.match_substring_regex(values, "[\\x00-\\x1f]"))
    if not control.any():
        return quoted
    fixed = quoted.to_pylist()
    for i, value in zip(np.flatnonzero(control).tolist(), values.take(pa.array(np.flatnonzero(control))).to_pylist()):
        fixed[i] = json.dumps(value, ensure_ascii=False)
    return pa.array(fixed, pa.string())


def _iso_time(values) -> pa.Array:
    """UTC ISO text like datetime.isoformat: microseconds only when there are any, then Z. Built from
    integer fields: Arrow's strftime and string cast of zoned timestamps are much slower."""
    micros = np.asarray(
        pc.fill_null(pc.cast(pc.cast(values, _TS), pa.int64()), 0).to_numpy(zero_copy_only=False), dtype=np.int64
    )
    days, rem = np.divmod(micros, 86_400_000_000)
    seconds, fraction = np.divmod(rem, 1_000_000)
    hours, rem = np.divmod(seconds, 3600)
    minutes, seconds = np.divmod(rem, 60)

    def padded(numbers: np.ndarray, width: int) -> pa.Array:
        return pc.utf8_lpad(pc.cast(pa.array(numbers), pa.string()), width=width, padding="0")

    fraction_text = pc.if_else(pa.array(fraction != 0), pc.binary_join_element_wise(".", padded(fraction, 6), ""), "")
    day_text = pc.cast(pa.array(days.astype(np.int32), pa.date32()), pa.string())
    text = pc.binary_join_element_wise(
        day_text, "T", padded(hours, 2), ":", padded(minutes, 2), ":", padded(seconds, 2), fraction_text, "Z", ""
    )
    return pc.if_else(pc.is_valid(values), text, pa.nulls(len(text), pa.string()))


def _json_string_list(lists: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Each list of strings as a compact JSON array (as orjson writes it; null stays null)."""
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    first = lists.offsets[0].as_py()
    values = lists.values.slice(first, lists.offsets[-1].as_py() - first)
    quoted = pa.ListArray.from_arrays(pc.subtract(lists.offsets, first), _json_string(values), mask=lists.is_null())
    return pc.binary_join_element_wise("[", pc.binary_join(quoted, ","), "]", "")


# Rows per thread of request_json: Arrow's kernels release the GIL, so the driver's cores share a large batch.
JSON_ROWS_PER_THREAD = 100_000


def request_json(table: pa.Table) -> pa.ChunkedArray:
    """The canonical JSON text of every request (CANONICAL_SCHEMA columns), keys sorted, nulls left out."""
    n = table.num_rows
    threads = min(os.cpu_count() or 1, 4, max(1, n // JSON_ROWS_PER_THREAD))
    if threads > 1:
        step = -(-n // threads)
        with ThreadPoolExecutor(threads) as pool:
            parts = list(pool.map(_request_json, [table.slice(i, step) for i in range(0, n, step)]))
        return pa.chunked_array([chunk for part in parts for chunk in part.chunks], pa.string())
    return _request_json(table)


def _request_json(table: pa.Table) -> pa.ChunkedArray:
    n = table.num_rows
    if n == 0:
        return pa.chunked_array([], pa.string())
    values = {
        "request_time": _json_string(_iso_time(table["request_time"])),
        "date_from": _json_string(pc.cast(table["date_from"], pa.string())),
        "date_to": _json_string(pc.cast(table["date_to"], pa.string())),
        "from_ids": _json_string_list(table["from_ids"]),
        "record": table["record"],
    }
    parts = []
    for name in sorted(CANONICAL_SCHEMA.names):
        value = values[name] if name in values else _json_string(table[name])
        parts.append(pc.binary_join_element_wise(f'"{name}": ', value, ""))
    body = pc.binary_join_element_wise(*parts, ", ", null_handling="skip")
    return pc.binary_join_element_wise("{", body, "}", "")
