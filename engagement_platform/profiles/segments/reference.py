"""The slow, obviously correct segment evaluator the tests compare the one-pass evaluator with: one
segment at a time, over plain dicts (raw rows with `fields` as JSON text, parsed again wherever a value
is needed), walking the definition tree directly. Nothing is compiled, cached or shared."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from engagement_platform.profiles.segments.definitions import (
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

ABSENT = ("absent",)


def _get(row: dict, path: str):
    if path.startswith("fields."):
        try:
            node = json.loads(row["fields"]) if row.get("fields") else None
        except ValueError:
            node = None
        for key in path.split(".")[1:]:
            if isinstance(node, dict) and key in node:
                node = node[key]
            else:
                return ABSENT
        return ABSENT if node is None else node
    value = row.get(path)
    if isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return ABSENT if value is None else value


def _same_kind(a, b) -> bool:
    def kind(x):
        if isinstance(x, bool):
            return "bool"
        if isinstance(x, (int, float)):
            return "number"
        if isinstance(x, str):
            return "str"
        if isinstance(x, datetime):
            return "time"
        return "other"

    return kind(a) == kind(b) and kind(a) != "other"


def holds(value, op: str, literal) -> bool:
    if value is ABSENT:
        return False
    if op == "exists":
        return True
    if op in ("has", "has_any", "has_all") or op.startswith("size"):
        return isinstance(value, list) and array_holds(value, op, literal)
    if op == "in":
        return any(holds(value, "=", x) for x in literal)
    if op == "contains":
        return isinstance(value, str) and literal in value
    if not _same_kind(value, literal):
        return False
    if op == "=":
        return value == literal
    if op == "!=":
        return value != literal
    if isinstance(value, bool):
        return False
    if op == "<":
        return value < literal
    if op == "<=":
        return value <= literal
    if op == ">":
        return value > literal
    return value >= literal


def array_holds(elements: list, op: str, literal) -> bool:
    if op.startswith("size"):
        return holds(len(elements), op[len("size") :], literal)
    wanted = [literal] if op == "has" else list(literal)
    found = [any(holds(e, "=", w) for e in elements if e is not None) for w in wanted]
    return all(found) if op == "has_all" else any(found)


def record_holds(node, row: dict) -> bool:
    if isinstance(node, Cmp):
        return holds(_get(row, node.path), node.op, node.value)
    if isinstance(node, AllOf):
        return all(record_holds(i, row) for i in node.items)
    if isinstance(node, AnyOf):
        return any(record_holds(i, row) for i in node.items)
    return not record_holds(node.item, row)


def identity_holds(node, rows: list[dict], now: datetime) -> bool:
    if isinstance(node, AllOf):
        return all(identity_holds(i, rows, now) for i in node.items)
    if isinstance(node, AnyOf):
        return any(identity_holds(i, rows, now) for i in node.items)
    if isinstance(node, Not):
        return not identity_holds(node.item, rows, now)
    if isinstance(node, HasType):
        return any(r.get("record_type") == node.record_type for r in rows)
    if isinstance(node, Ids):
        return holds(len({r["primary_id"] for r in rows}), node.op, node.value)
    if isinstance(node, Profile):
        newest_first = sorted(rows, key=lambda r: _get(r, "cdc_ts"), reverse=True)
        for r in newest_first:
            value = _get(r, node.cmp.path)
            if value is not ABSENT:
                return holds(value, node.cmp.op, node.cmp.value)
        return False
    assert isinstance(node, Aggregate)
    chosen = []
    for r in rows:
        ts = _get(r, "cdc_ts")
        if node.within_s is not None and not (now.timestamp() - node.within_s <= ts.timestamp() <= now.timestamp()):
            continue
        if node.where is not None and not record_holds(node.where, r):
            continue
        chosen.append(r)
    if node.kind in ("count", "exists"):
        return holds(len(chosen), node.op, node.value)
    values = [v for r in chosen if (v := _get(r, node.path)) is not ABSENT and _same_kind(v, node.value)]
    if not values:
        return False
    return holds(min(values) if node.kind == "min" else max(values), node.op, node.value)


def members(segment: Segment, identities: dict[str, list[dict]], now: datetime) -> set[str]:
    """The identities (keys) in one segment."""
    return {key for key, rows in identities.items() if identity_holds(segment.where, rows, now)}
