"""Every segment of a tenant over each merged profile in one pass (pure: no Spark, no Dagster).

The segments are compiled once into closures; each identity's records are parsed once (JSON payload
included) and every segment is evaluated on that one view, instead of one query per segment. Spark tasks
run this per tenant (apply.py); the slow reference (reference.py) evaluates each segment alone.

Comparison rules (definitions.py): a missing value, or one of another type than the literal, makes a
comparison false (`exists` is true for any present value); numbers compare with numbers, booleans with
booleans, strings with strings, timestamps with timestamps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from engagement_platform.profiles.segments.definitions import Aggregate, AllOf, AnyOf, Cmp, HasType, Ids, Not, Profile, Segment

MISSING = object()
RECORD_COLUMNS = ("primary_id", "record_type", "cdc_ts", "email", "country", "updated_at")


@dataclass
class ProfileRecord:
    primary_id: str
    record_type: str | None
    cdc_ts: datetime
    email: str | None = None
    country: str | None = None
    updated_at: datetime | None = None
    fields: dict | None = None

    @staticmethod
    def of_row(row: dict) -> ProfileRecord:
        """A raw table row (fields as JSON text) as a record, parsed once."""
        text = row.get("fields")
        try:
            fields = json.loads(text) if text else None
        except ValueError:
            fields = None
        return ProfileRecord(row["primary_id"], row.get("record_type"), _utc(row["cdc_ts"]), row.get("email"), row.get("country"),
                             _utc(row.get("updated_at")), fields if isinstance(fields, dict) else None)


def _utc(value):
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


def value_at(record: ProfileRecord, path: str) -> Any:
    if not path.startswith("fields."):
        value = getattr(record, path)
        return MISSING if value is None else value
    node: Any = record.fields
    for key in path.split(".")[1:]:
        if not isinstance(node, dict) or key not in node:
            return MISSING
        node = node[key]
    return MISSING if node is None else node


def _kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, datetime):
        return "time"
    return None


def compare(value: Any, op: str, literal: Any) -> bool:
    if value is MISSING:
        return False
    if op == "exists":
        return True
    if op == "in":
        return any(compare(value, "=", item) for item in literal)
    if op == "contains":
        return isinstance(value, str) and literal in value
    kind = _kind(value)
    if kind is None or kind != _kind(literal):
        return False
    if op == "=":
        return value == literal
    if op == "!=":
        return value != literal
    if kind == "bool":
        return False  # booleans have no order
    return {"<": value < literal, "<=": value <= literal, ">": value > literal, ">=": value >= literal}[op]


@dataclass
class IdentityView:
    """One merged profile as every segment sees it: its live records (newest first) and what is derived once."""

    records: list[ProfileRecord]
    now: datetime
    _latest: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.records = sorted(self.records, key=lambda r: r.cdc_ts, reverse=True)
        self.ids = {r.primary_id for r in self.records}
        self.types = {r.record_type for r in self.records}

    def latest(self, path: str) -> Any:
        """The path's value in the newest record that has it."""
        if path not in self._latest:
            self._latest[path] = next((v for r in self.records if (v := value_at(r, path)) is not MISSING), MISSING)
        return self._latest[path]


def _combined(node, compile_item) -> Callable | None:
    """all / any / not of compiled parts (for record and identity conditions alike); None: not a combinator."""
    if isinstance(node, (AllOf, AnyOf)):
        parts, every = [compile_item(i) for i in node.items], isinstance(node, AllOf)
        return (lambda x: all(p(x) for p in parts)) if every else (lambda x: any(p(x) for p in parts))
    if isinstance(node, Not):
        inner = compile_item(node.item)
        return lambda x: not inner(x)
    return None


def compile_record(node) -> Callable[[ProfileRecord], bool]:
    if isinstance(node, Cmp):
        path, op, literal = node.path, node.op, node.value
        return lambda r: compare(value_at(r, path), op, literal)
    combined = _combined(node, compile_record)
    if combined is None:
        raise TypeError(f"not a record condition: {node!r}")
    return combined


def compile_identity(node) -> Callable[[IdentityView], bool]:
    combined = _combined(node, compile_identity)
    if combined is not None:
        return combined
    if isinstance(node, Profile):
        path, op, literal = node.cmp.path, node.cmp.op, node.cmp.value
        return lambda v: compare(v.latest(path), op, literal)
    if isinstance(node, Ids):
        return lambda v: compare(len(v.ids), node.op, node.value)
    if isinstance(node, HasType):
        return lambda v: node.record_type in v.types
    if isinstance(node, Aggregate):
        return _compile_aggregate(node)
    raise TypeError(f"not an identity condition: {node!r}")


def _compile_aggregate(node: Aggregate) -> Callable[[IdentityView], bool]:
    where = compile_record(node.where) if node.where is not None else (lambda r: True)

    def matching(v: IdentityView) -> Iterable[ProfileRecord]:
        since = v.now.timestamp() - node.within_s if node.within_s is not None else None
        return (r for r in v.records if (since is None or since <= r.cdc_ts.timestamp() <= v.now.timestamp()) and where(r))

    if node.kind in ("count", "exists"):
        return lambda v: compare(sum(1 for _ in matching(v)), node.op, node.value)

    def extreme(v: IdentityView) -> bool:
        values = [x for r in matching(v) if (x := value_at(r, node.path)) is not MISSING and _kind(x) is not None and _kind(x) == _kind(node.value)]
        if not values:
            return False
        return compare(min(values) if node.kind == "min" else max(values), node.op, node.value)
    return extreme


def evaluate(identities: Iterable[tuple[str, list[ProfileRecord]]], segments: list[Segment], now: datetime) -> list[tuple[str, str]]:
    """(identity key, segment name) for every identity in every segment it satisfies: one pass, each
    identity's records parsed once, all segments compiled once."""
    compiled = [(s.name, compile_identity(s.where)) for s in segments]
    out = []
    for key, records in identities:
        view = IdentityView(list(records), now)
        out += [(key, name) for name, test in compiled if test(view)]
    return out


def windows_of(segments: list[Segment]) -> set[float]:
    """The time windows (seconds) the segments' aggregates use: what makes membership change with time alone."""
    found: set[float] = set()

    def walk(node) -> None:
        if isinstance(node, (AllOf, AnyOf)):
            for item in node.items:
                walk(item)
        elif isinstance(node, Not):
            walk(node.item)
        elif isinstance(node, Aggregate) and node.within_s is not None:
            found.add(node.within_s)

    for s in segments:
        walk(s.where)
    return found


def time_affected(records: Iterable[tuple[str, datetime]], windows: set[float], before: datetime, now: datetime) -> set[str]:
    """Identities (of (identity, cdc_ts) pairs) whose windowed aggregates can differ between evaluations at
    `before` and at `now` with no change to their rows: a record entered a window (cdc_ts in (before, now])
    or left one (cdc_ts + window in (before, now])."""
    if not windows:
        return set()
    lo, hi = before.timestamp(), now.timestamp()
    out = set()
    for key, ts in records:
        t = _utc(ts).timestamp()
        if lo < t <= hi or any(lo < t + w <= hi for w in windows):
            out.add(key)
    return out
