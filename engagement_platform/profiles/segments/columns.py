"""A tenant's merged profiles as columns (pure: no Spark, no Dagster): the live raw rows sorted by identity,
newest first, with every path the segments read turned into typed NumPy columns once.

Segment evaluation (evaluate.py) then works on whole columns: a record condition is one vectorised
comparison over every record of the tenant, an aggregate one `reduceat` over the identities' runs of
records. That is what lets thousands of segments share one pass over the rows.

Values keep the comparison rules of definitions.py: a path's value has a kind (str, number, bool, time,
or none for JSON lists and objects), and a comparison only holds between values of the literal's kind.
Numbers compare as float64 (exact for integers up to 2**53). A path that holds JSON arrays also gets their
elements flattened into one column of their own (`Arrays`), built in the same walk over the parsed rows, so
the array ops are the same vectorised comparisons over elements, then one scatter back to the records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

STRING_PATHS = ("record_type", "primary_id", "email", "country")
TIME_PATHS = ("cdc_ts", "updated_at")
RECORD_COLUMNS = ("primary_id", "record_type", "cdc_ts", "email", "country", "updated_at", "fields")


def time_us(value: datetime) -> int:
    """Microseconds since the epoch, exactly (no float on the way)."""
    delta = value - datetime(1970, 1, 1, tzinfo=value.tzinfo)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def constant(value, type_: pa.DataType, n: int) -> pa.Array:
    """`value` n times, built in Arrow (a Python list of a million datetimes takes a second)."""
    if pa.types.is_timestamp(type_):
        return pa.array(np.full(n, time_us(value), np.int64)).cast(type_)
    if pa.types.is_integer(type_):
        return pa.array(np.full(n, value, np.int64)).cast(type_)
    return pa.repeat(pa.scalar(value, type_), n)


@dataclass
class Column:
    """One path over every record: where it is present, and its values by kind (each with a mask)."""

    present: np.ndarray
    strings: pa.Array | None = None  # string array, null where the value is not a string
    numbers: tuple[np.ndarray, np.ndarray] | None = None  # (float64 values, mask)
    bools: tuple[np.ndarray, np.ndarray] | None = None  # (bool values, mask)
    times: tuple[np.ndarray, np.ndarray] | None = None  # (int64 microseconds, mask)
    arrays: Arrays | None = None  # JSON paths only


@dataclass
class Arrays:
    """A JSON path's arrays over every record: which records hold one, its length, and every element."""

    held: np.ndarray  # bool per record: the value is an array
    lengths: np.ndarray  # int64 per record, 0 where it is not an array
    owner: np.ndarray  # record index per element
    elements: Column  # the elements, as a column of their own (arrays inside arrays have no kind)

    def any_element(self, matched: np.ndarray) -> np.ndarray:
        """Per record: does any element of its array satisfy `matched` (a bool per element)?"""
        out = np.zeros(len(self.held), bool)
        out[self.owner[matched]] = True
        return out


def _strings(values: list) -> pa.Array:
    try:
        return pa.array(values, pa.string())
    except (UnicodeEncodeError, pa.ArrowInvalid):  # a lone surrogate from a JSON escape: kept as replacement characters
        return pa.array(
            [v.encode("utf-8", "surrogatepass").decode("utf-8", "replace") if v is not None else None for v in values],
            pa.string(),
        )


def _float(value) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer beyond float64: it still orders as infinity
        return float("inf") if value > 0 else float("-inf")


def _json_column(values: list, elements_of_arrays: bool = True) -> Column:
    """A column of Python values taken from JSON (MISSING as None), with its arrays' elements when asked."""
    n = len(values)
    present = np.fromiter((v is not None for v in values), bool, n)
    arrays = None
    if elements_of_arrays:
        held = np.fromiter((type(v) is list for v in values), bool, n)
        lengths = np.zeros(n, np.int64)
        owners = np.flatnonzero(held)
        lengths[owners] = [len(values[i]) for i in owners]
        flat = [e for i in owners for e in values[i]]
        arrays = Arrays(held, lengths, np.repeat(np.arange(n), lengths), _json_column(flat, elements_of_arrays=False))
    strings = [v if type(v) is str else None for v in values]
    number_mask = np.fromiter((type(v) in (int, float) for v in values), bool, n)
    numbers = np.zeros(n, np.float64)
    if number_mask.any():
        idx = np.flatnonzero(number_mask)
        numbers[idx] = [_float(values[i]) for i in idx]
    bool_mask = np.fromiter((type(v) is bool for v in values), bool, n)
    bools = np.fromiter((v is True for v in values), bool, n)
    return Column(present, _strings(strings), (numbers, number_mask), (bools, bool_mask), arrays=arrays)


def _parse(text):
    if text is None:
        return None
    try:
        node = orjson.loads(text)
    except orjson.JSONDecodeError:  # what orjson refuses (NaN, lone surrogates) the stdlib may still read
        try:
            node = json.loads(text)
        except ValueError:
            return None
    return node if isinstance(node, dict) else None


def _walk(node, keys: list[str]):
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


@dataclass
class Profiles:
    """Live raw rows grouped by identity (contiguous runs, newest first within each run)."""

    keys: pa.Array  # identity key per identity
    starts: np.ndarray  # first record of each identity
    group: np.ndarray  # identity index per record
    cdc_us: np.ndarray  # cdc_ts per record, microseconds
    primary_ids: pa.Array
    columns: dict[str, Column] = field(default_factory=dict)
    parts: np.ndarray | None = None  # with `within`: the part (e.g. tenant) of each identity, ascending

    def part_ranges(self, count: int) -> list[tuple[slice, slice]]:
        """(identities, records) of each of `count` parts: contiguous, as the rows are sorted by part first."""
        parts = self.parts if self.parts is not None else np.zeros(self.size, np.int64)
        bounds = np.searchsorted(parts, np.arange(count + 1))
        records = np.append(self.starts, self.records)[bounds]
        return [(slice(a, b), slice(r, s)) for a, b, r, s in zip(bounds, bounds[1:], records, records[1:])]

    @property
    def size(self) -> int:
        return len(self.keys)

    @property
    def records(self) -> int:
        return len(self.group)


def profiles_of(rows: pa.Table, paths: set[str], identity: str = "component_id", within: str | None = None) -> Profiles:
    """The rows (raw table columns, deleted rows already dropped) as Profiles with a Column per path in
    `paths` (record paths and `fields.<a>.<b>`). Ties in cdc_ts keep the rows' order, as a stable sort does.
    `within`: an integer column (0, 1, ...) that splits the rows into parts, such as tenants, evaluated
    together: an identity is then a (part, identity) pair, the parts come in order, and `parts` names each
    identity's part. Identities never span parts, so evaluating parts together gives each part's own answer."""
    order = [(identity, "ascending"), ("cdc_ts", "descending")]
    rows = rows.take(pc.sort_indices(rows, sort_keys=[(within, "ascending"), *order] if within else order))
    n = rows.num_rows
    ids = rows[identity].combine_chunks()
    part = np.asarray(rows[within].combine_chunks().to_numpy(zero_copy_only=False), np.int64) if within else None
    if n:
        change = np.asarray(pc.not_equal(ids.slice(1), ids.slice(0, n - 1)).fill_null(True), bool)
        if part is not None:
            change |= part[1:] != part[:-1]
        starts = np.concatenate([[0], np.flatnonzero(change) + 1]).astype(np.int64)
    else:
        starts = np.zeros(0, np.int64)
    group = np.zeros(n, np.int64)
    if len(starts) > 1:
        group[starts[1:]] = 1
        group = np.cumsum(group)
    cdc = rows["cdc_ts"].combine_chunks().cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    profiles = Profiles(
        ids.take(pa.array(starts)),
        starts,
        group,
        np.asarray(cdc.fill_null(0), np.int64),
        rows["primary_id"].combine_chunks(),
        parts=part[starts] if part is not None else None,
    )
    field_paths = sorted(p for p in paths if p.startswith("fields."))
    if field_paths:
        parsed = [_parse(t) for t in rows["fields"].to_pylist()]
        for path in field_paths:
            keys = path.split(".")[1:]
            profiles.columns[path] = _json_column([_walk(node, keys) for node in parsed])
    for path in (p for p in paths if not p.startswith("fields.")):
        data = rows[path].combine_chunks()
        present = np.asarray(data.is_valid(), bool)
        if path in TIME_PATHS:
            us = np.asarray(data.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).fill_null(0), np.int64)
            profiles.columns[path] = Column(present, times=(us, present))
        else:
            profiles.columns[path] = Column(present, strings=data.cast(pa.string()))
    return profiles
