"""Every segment of a tenant over each merged profile in one pass, on columns (pure: no Spark, no Dagster).

The profiles (columns.py) hold every record of the tenant sorted into identity runs. The segments compile
into one plan of column operations in which every sub-condition is computed once, whichever segments share
it: `record_type = trial` is one comparison over all records even when 400 segments use it; a window mask
is one per window; an aggregate one `reduceat` over the identity runs. Each segment ends as a boolean per
identity. Spark tasks run this per tenant (apply.py); the slow reference (reference.py) evaluates each
segment alone, identity by identity, over plain dicts, and the tests hold the two equal (hypothesis).

Comparison rules (definitions.py): a missing value, or one of another kind than the literal, makes a
comparison false (`exists` is true for any present value); numbers compare with numbers, booleans with
booleans (= and != only), strings with strings, timestamps with timestamps. The array ops are false on
anything but an array; their elements compare as `=` does.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.profiles.segments.columns import Column, Profiles, constant, time_us
from engagement_platform.profiles.segments.definitions import (
    ARRAY_OPS,
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
)

T = TypeVar("T")
MEMBER_SCHEMA = pa.schema([("identity", pa.string()), ("segment", pa.string())])
_ORDER = {"=": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}
_ARROW = {"=": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}


def kind_of(value) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, datetime):
        return "time"
    return None


_KEYS: dict[int, tuple[object, str]] = {}  # id(node) -> (the node, kept so its id is not reused; its key)


def node_key(node) -> str:
    """A condition's cache key in a plan: its repr, not the node itself (1, 1.0 and True are equal as dict keys
    but not as literals here). Remembered per node object: one task evaluates many tenants with the same
    segment objects, and the repr of a deep tree of dataclasses costs more than the evaluation of a small
    tenant."""
    known = _KEYS.get(id(node))
    if known is None or known[0] is not node:
        if len(_KEYS) > 200_000:  # definitions change rarely; a long-lived worker must not grow without end
            _KEYS.clear()
        known = _KEYS[id(node)] = (node, repr(node))
    return known[1]


def _bools(array: pa.Array) -> np.ndarray:
    return np.asarray(array.fill_null(False).to_numpy(zero_copy_only=False), bool)


def compare(column: Column, op: str, literal) -> np.ndarray:
    """Per record: does the column's value satisfy `op literal`?"""
    n = len(column.present)
    if op == "exists":
        return column.present
    if op in ARRAY_OPS:
        return compare_arrays(column, op, literal) if column.arrays is not None else np.zeros(n, bool)
    if op == "in":
        return np.logical_or.reduce([compare(column, "=", item) for item in literal]) if literal else np.zeros(n, bool)
    if op == "contains":
        return _bools(pc.match_substring(column.strings, literal)) if column.strings is not None else np.zeros(n, bool)
    kind = kind_of(literal)
    if kind == "str" and column.strings is not None:
        return _bools(_ARROW[op](column.strings, pa.scalar(literal, pa.string())))
    typed = {"number": column.numbers, "time": column.times, "bool": column.bools}.get(kind)
    if typed is None or (kind == "bool" and op not in ("=", "!=")):
        return np.zeros(n, bool)
    values, mask = typed
    target = time_us(literal) if kind == "time" else literal
    return mask & _ORDER[op](values, target)


def compare_arrays(column: Column, op: str, literal) -> np.ndarray:
    """Per record: does the column's value, an array, satisfy the array op?"""
    arrays = column.arrays
    assert arrays is not None
    if op in SIZE_OPS:
        return arrays.held & _ORDER[op[len("size") :]](arrays.lengths, literal)
    wanted = [literal] if op == "has" else list(literal)
    found = [arrays.any_element(compare(arrays.elements, "=", item)) for item in wanted]
    return (np.logical_and if op == "has_all" else np.logical_or).reduce(found)


class Plan:
    """The compiled segments of one tenant over its profiles: every shared sub-condition computed once."""

    def __init__(self, profiles: Profiles, now: datetime):
        self.p, self.now = profiles, now
        self.seconds = profiles.cdc_us / 1e6  # the same float seconds as datetime.timestamp()
        self.cache: dict[str, np.ndarray] = {}

    def _once(self, key: str, compute: Callable[[], np.ndarray]) -> np.ndarray:
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]

    def _runs(self, ufunc, values: np.ndarray) -> np.ndarray:
        return ufunc.reduceat(values, self.p.starts) if self.p.size else np.zeros(0, values.dtype)

    def cmp(self, node: Cmp) -> np.ndarray:
        return self._once(f"cmp {node_key(node)}", lambda: compare(self.p.columns[node.path], node.op, node.value))

    def record(self, node) -> np.ndarray:
        if isinstance(node, Cmp):
            return self.cmp(node)
        return self._once(f"record {node_key(node)}", lambda: self._combine(node, self.record))

    def identity(self, node) -> np.ndarray:
        return self._once(f"identity {node_key(node)}", lambda: self._identity(node))

    def _combine(self, node, each) -> np.ndarray:
        if isinstance(node, Not):
            return ~each(node.item)
        parts = [each(item) for item in node.items]
        return (np.logical_and if isinstance(node, AllOf) else np.logical_or).reduce(parts)

    def _identity(self, node) -> np.ndarray:
        if isinstance(node, (AllOf, AnyOf, Not)):
            return self._combine(node, self.identity)
        if isinstance(node, HasType):
            return self._runs(np.logical_or, self.cmp(Cmp("record_type", "=", node.record_type)))
        if isinstance(node, Ids):
            return _ORDER[node.op](self._distinct_ids(), node.value)
        if isinstance(node, Profile):
            column = self.p.columns[node.cmp.path]
            n = self.p.records
            first = self._runs(np.minimum, np.where(column.present, np.arange(n), n))
            return (first < n) & self.cmp(node.cmp)[np.minimum(first, max(n - 1, 0))] if n else np.zeros(0, bool)
        return self._aggregate(node)

    def _distinct_ids(self) -> np.ndarray:
        def count() -> np.ndarray:
            codes = np.asarray(self.p.primary_ids.dictionary_encode().indices.to_numpy(zero_copy_only=False), np.int64)
            pairs = np.unique(self.p.group * (int(codes.max(initial=0)) + 1) + codes)
            return np.bincount(pairs // (int(codes.max(initial=0)) + 1), minlength=self.p.size)

        return self._once("distinct ids", count)

    def window(self, within_s: float | None) -> np.ndarray | None:
        if within_s is None:
            return None
        now = self.now.timestamp()
        return self._once(f"window {within_s!r}", lambda: (now - within_s <= self.seconds) & (self.seconds <= now))

    def _aggregate(self, node: Aggregate) -> np.ndarray:
        chosen = self.record(node.where) if node.where is not None else np.ones(self.p.records, bool)
        window = self.window(node.within_s)
        if window is not None:
            chosen = chosen & window
        if node.kind in ("count", "exists"):
            return _ORDER[node.op](self._runs(np.add, chosen.astype(np.int64)), node.value)
        column, kind = self.p.columns[node.path], kind_of(node.value)
        if kind == "str" and column.strings is not None:
            ok = chosen & _bools(column.strings.is_valid())
            ranks = np.asarray(pc.rank(column.strings, sort_keys="ascending", tiebreaker="dense"), np.int64)
            fill, ufunc = (np.iinfo(np.int64).max, np.minimum) if node.kind == "min" else (-1, np.maximum)
            extreme = self._runs(ufunc, np.where(ok, ranks, fill))
            at_extreme = ok & (ranks == extreme[self.p.group]) & self.cmp(Cmp(node.path, node.op, node.value))
            return self._runs(np.logical_or, at_extreme)
        typed = {"number": column.numbers, "time": column.times, "bool": column.bools}.get(kind)
        if typed is None or (kind == "bool" and node.op not in ("=", "!=")):
            return np.zeros(self.p.size, bool)
        values, mask = typed
        values = values.astype(np.float64 if kind == "number" else np.int64)
        ok = chosen & mask
        if kind == "number":
            fill = np.inf if node.kind == "min" else -np.inf
        else:
            fill = np.iinfo(np.int64).max if node.kind == "min" else np.iinfo(np.int64).min
        extreme = self._runs(np.minimum if node.kind == "min" else np.maximum, np.where(ok, values, fill))
        target = time_us(node.value) if kind == "time" else node.value
        return self._runs(np.logical_or, ok) & _ORDER[node.op](extreme, target)


def by_definitions(compute: Callable[[list[Segment]], T]) -> Callable[[list[Segment]], T]:
    """`compute(segments)` remembered for the same segment objects (kept, so their ids are not reused): a task
    evaluates many tenants with the same definitions, and walking 1,000 trees costs more than evaluating a
    small tenant. Callers must not change the answer."""
    memo: dict[object, tuple[object, T]] = {}

    def remembered(segments: list[Segment]) -> T:
        # a tuple cannot change: the tuple itself (kept) is the key, and the works of one job share one
        key = ("tuple", id(segments)) if isinstance(segments, tuple) else tuple(id(s) for s in segments)
        known = memo.get(key)
        if known is None or (isinstance(segments, tuple) and known[0] is not segments):
            if len(memo) > 64:  # definitions change rarely; a long-lived worker must not grow without end
                memo.clear()
            kept = segments if isinstance(segments, tuple) else list(segments)
            known = memo[key] = (kept, compute(segments))
        return known[1]

    return remembered


def nodes(segments: list[Segment]):
    """Every condition node of the segments' trees, record conditions inside aggregates included."""
    todo = [s.where for s in segments]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, (AllOf, AnyOf)):
            todo.extend(node.items)
        elif isinstance(node, Not):
            todo.append(node.item)
        elif isinstance(node, Aggregate) and node.where is not None:
            todo.append(node.where)


@by_definitions
def paths_of(segments: list[Segment]) -> set[str]:
    """Every record path the segments read (record_type always: has_type reads it)."""
    found = {"record_type"}
    for node in nodes(segments):
        if isinstance(node, Cmp):
            found.add(node.path)
        elif isinstance(node, Profile):
            found.add(node.cmp.path)
        elif isinstance(node, Aggregate) and node.path:
            found.add(node.path)
    return found


def evaluate(profiles: Profiles, segments: list[Segment], now: datetime) -> dict[str, np.ndarray]:
    """segment name -> a boolean per identity of `profiles`: one plan for all segments."""
    plan = Plan(profiles, now)
    return {s.name: plan.identity(s.where) for s in segments}


def member_pairs(profiles: Profiles, results: dict[str, np.ndarray]) -> pa.Table:
    """(identity, segment) for every identity in every segment it satisfies."""
    parts = [
        pa.table(
            {
                "identity": profiles.keys.take(pa.array(np.flatnonzero(inside))),
                "segment": constant(name, pa.string(), int(inside.sum())),
            }
        )
        for name, inside in results.items()
        if inside.any()
    ]
    return pa.concat_tables(parts).cast(MEMBER_SCHEMA) if parts else MEMBER_SCHEMA.empty_table()


@by_definitions
def windows_of(segments: list[Segment]) -> set[float]:
    """The time windows (seconds) the segments' aggregates use: what makes membership change with time alone."""
    return {n.within_s for n in nodes(segments) if isinstance(n, Aggregate) and n.within_s is not None}


def time_affected(cdc_us: np.ndarray, windows: set[float], before: datetime, now: datetime) -> np.ndarray:
    """Per record: can its identity's windowed aggregates differ between evaluations at `before` and at `now`
    with no change to its rows? Yes when the record entered a window (cdc_ts in (before, now]) or left one
    (cdc_ts + window in (before, now])."""
    if not windows:
        return np.zeros(len(cdc_us), bool)
    t, lo, hi = cdc_us / 1e6, before.timestamp(), now.timestamp()
    hit = (lo < t) & (t <= hi)
    for w in windows:
        hit |= (lo < t + w) & (t + w <= hi)
    return hit
