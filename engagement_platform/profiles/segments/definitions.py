"""Segment definitions: YAML files -> checked condition trees (pure: no Spark, no Dagster, no I/O but reading).

A segment is a predicate over a merged profile (an identity: the raw rows of one connected component).

    name: trialled_x_not_purchased
    description: Trialled product X in the last 7 days, added Y to the cart, has not purchased.
    where:
      all:
        - exists: {where: {all: [{path: record_type, op: "=", value: trial}, {path: fields.product, op: "=", value: X}]}, within: 7d}
        - exists: {where: {path: fields.cart.product, op: "=", value: Y}}
        - not: {exists: {where: {path: record_type, op: "=", value: purchase}}}

Identity conditions (a mapping with one key): `all: [...]`, `any: [...]`, `not: {...}`;
`profile: {path, op, value}` (the value of the newest record, by cdc_ts, that has the path);
`ids: {op, value}` (how many ids are linked); `has_type: <record_type>`;
`count|exists|min|max: {where: <record condition>, within: <duration>, path: <for min/max>, op, value}`
over the identity's records whose cdc_ts lies within the window before the evaluation time.
Record conditions: `all`, `any`, `not`, and `{path, op, value}`. Paths: record_type, primary_id, cdc_ts,
the promoted columns (email, country, updated_at) and `fields.<a>.<b>` into the JSON payload. Ops: = != < <=
> >= in contains exists. A comparison whose value is missing or of another type than the literal is false.

Array ops, on `fields.` paths (the only ones a JSON array can be at), each false unless the value is an array:
`has: v` (an element equals v), `has_any: [v, ...]`, `has_all: [v, ...]`, and `size= size!= size< size<=
size> size>=: n` (the array's length, duplicates and nulls counted). Elements compare as `=` does: 1 and 1.0
match, 1 and "1" or true do not; a null, list or object element matches nothing. They are ops of the same
`{path, op, value}` shape rather than a new function, so they work wherever a comparison does (record
conditions, `profile`), and the size ops reuse the six comparison symbols the language already uses.

Every problem of a file is reported at load, one line each: `<file>: <path>: <problem>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

COMPARISONS = ("=", "!=", "<", "<=", ">", ">=")
SCALAR_OPS = (*COMPARISONS, "in", "contains")  # false on an array: evaluation warns when one reads an array
ELEMENT_OPS = ("has", "has_any", "has_all")
SIZE_OPS = tuple(f"size{c}" for c in COMPARISONS)
ARRAY_OPS = (*ELEMENT_OPS, *SIZE_OPS)
OPS = (*SCALAR_OPS, "exists", *ARRAY_OPS)
AGGREGATES = ("count", "exists", "min", "max")
TYPED_PATHS = {
    "record_type": str,
    "primary_id": str,
    "email": str,
    "country": str,
    "cdc_ts": datetime,
    "updated_at": datetime,
}
NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class SegmentError(ValueError):
    """Every problem of the definitions, one `<file>: <path>: <problem>` per line."""


@dataclass(frozen=True)
class Cmp:
    path: str
    op: str
    value: Any


@dataclass(frozen=True)
class AllOf:
    items: tuple


@dataclass(frozen=True)
class AnyOf:
    items: tuple


@dataclass(frozen=True)
class Not:
    item: Any


@dataclass(frozen=True)
class Profile:
    cmp: Cmp


@dataclass(frozen=True)
class Ids:
    op: str
    value: int


@dataclass(frozen=True)
class HasType:
    record_type: str


@dataclass(frozen=True)
class Aggregate:
    kind: str  # count | exists | min | max
    where: Any | None  # a record condition, None: every record
    within_s: float | None  # None: all of the identity's records
    path: str | None  # min / max
    op: str | None
    value: Any


@dataclass(frozen=True)
class Segment:
    name: str
    description: str
    where: Any
    source: str  # the file it came from


def duration_seconds(text: Any) -> float:
    match = DURATION.match(str(text).strip())
    if not match:
        raise ValueError(f"'{text}' is not a duration like 90s, 10m, 12h, 7d")
    return float(match.group(1)) * UNITS[match.group(2)]


def _literal(path: str, op: str, value: Any) -> Any:
    """The comparison's literal, typed for its path (timestamps parsed); raises ValueError on a mismatch."""
    if op == "exists":
        return None
    if op in ARRAY_OPS:
        return _array_literal(op, value)
    if op == "in":
        if not isinstance(value, list) or not value:
            raise ValueError("'in' takes a non-empty list")
        return tuple(_literal(path, "=", v) for v in value)
    if op == "contains" and not isinstance(value, str):
        raise ValueError("'contains' takes a string")
    kind = TYPED_PATHS.get(path)
    if kind is datetime:
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        try:
            parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{path} is a timestamp: {value!r} is not an ISO timestamp") from None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    if kind is str and not isinstance(value, str):
        raise ValueError(f"{path} is a string: {value!r} is not one")
    if value is None or isinstance(value, (list, dict)):
        raise ValueError(f"compare with a string, a number or a boolean, not {value!r}")
    return value


def _element(value: Any, op: str) -> Any:
    """An element to look for: what a JSON array can hold and a literal can equal (a YAML date is no JSON value:
    quote it)."""
    if not isinstance(value, (str, int, float)):  # bool is an int
        raise ValueError(f"'{op}' takes a string, a number or a boolean, not {value!r}")
    return value


def _array_literal(op: str, value: Any) -> Any:
    """An array op's literal: an element for has, a non-empty list of them for has_any / has_all, a length."""
    if op in SIZE_OPS:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"'{op}' compares an array's length with a whole number >= 0, not {value!r}")
        return value
    if op == "has":
        if isinstance(value, list):
            raise ValueError("'has' takes one element: for a list of them use has_any or has_all")
        return _element(value, op)
    if not isinstance(value, list) or not value:
        raise ValueError(f"'{op}' takes a non-empty list of elements")
    return tuple(_element(v, op) for v in value)


class _Parser:
    def __init__(self, source: str):
        self.source, self.problems = source, []

    def problem(self, at: str, text: str) -> None:
        self.problems.append(f"{self.source}: {at}: {text}")

    def one_key(self, node: Any, at: str, allowed: tuple[str, ...]) -> tuple[str, Any] | None:
        if not isinstance(node, dict) or len(node) != 1:
            self.problem(at, f"expected a mapping with one of {', '.join(allowed)}")
            return None
        ((key, body),) = node.items()
        if key not in allowed:
            self.problem(at, f"unknown function '{key}' (known: {', '.join(allowed)})")
            return None
        return key, body

    def cmp(self, node: Any, at: str) -> Cmp | None:
        if not isinstance(node, dict) or not {"path", "op"} <= set(node) or set(node) - {"path", "op", "value"}:
            self.problem(at, "a comparison is {path, op, value}")
            return None
        path, op = str(node["path"]), str(node["op"])
        if path not in TYPED_PATHS and not re.match(r"^fields(\.[A-Za-z0-9_-]+)+$", path):
            self.problem(f"{at}.path", f"unknown field '{path}' (known: {', '.join(TYPED_PATHS)}, fields.<key>...)")
            return None
        if op not in OPS:
            self.problem(f"{at}.op", f"unknown operator '{op}' (known: {' '.join(OPS)})")
            return None
        if op in ARRAY_OPS and not path.startswith("fields."):
            self.problem(f"{at}.op", f"'{op}' reads an array and {path} never holds one (array ops take fields.<key>)")
            return None
        if op != "exists" and "value" not in node:
            self.problem(at, f"'{op}' needs a value")
            return None
        try:
            return Cmp(path, op, _literal(path, op, node.get("value")))
        except ValueError as exc:
            self.problem(f"{at}.value", f"type mismatch: {exc}")
            return None

    def record(self, node: Any, at: str):
        if isinstance(node, dict) and "path" in node:
            return self.cmp(node, at)
        parsed = self.one_key(node, at, ("all", "any", "not"))
        if parsed is None:
            return None
        key, body = parsed
        if key == "not":
            inner = self.record(body, f"{at}.not")
            return Not(inner) if inner is not None else None
        return self.group(key, body, at, self.record)

    def group(self, key: str, body: Any, at: str, each):
        if not isinstance(body, list) or not body:
            self.problem(f"{at}.{key}", "expected a non-empty list")
            return None
        items = [each(item, f"{at}.{key}[{i}]") for i, item in enumerate(body)]
        if any(i is None for i in items):
            return None
        return (AllOf if key == "all" else AnyOf)(tuple(items))

    def identity(self, node: Any, at: str):
        parsed = self.one_key(node, at, ("all", "any", "not", "profile", "ids", "has_type", *AGGREGATES))
        if parsed is None:
            return None
        key, body = parsed
        here = f"{at}.{key}"
        if key in ("all", "any"):
            return self.group(key, body, at, self.identity)
        if key == "not":
            inner = self.identity(body, here)
            return Not(inner) if inner is not None else None
        if key == "profile":
            found = self.cmp(body, here)
            return Profile(found) if found is not None else None
        if key == "has_type":
            if not isinstance(body, str):
                self.problem(here, "expected a record type")
                return None
            return HasType(body)
        if key == "ids":
            if not isinstance(body, dict) or set(body) != {"op", "value"}:
                self.problem(here, "ids is {op, value}")
                return None
            if body["op"] not in COMPARISONS:
                self.problem(f"{here}.op", f"unknown operator '{body['op']}' (ids takes = != < <= > >=)")
                return None
            if not isinstance(body["value"], int) or isinstance(body["value"], bool):
                self.problem(f"{here}.value", "type mismatch: ids compares a number of ids")
                return None
            return Ids(body["op"], body["value"])
        return self.aggregate(key, body, here)

    def aggregate(self, kind: str, body: Any, at: str) -> Aggregate | None:
        keys = {"where", "within", "path", "op", "value"}
        if not isinstance(body, dict) or set(body) - keys:
            self.problem(at, f"expected a mapping of {', '.join(sorted(keys))}")
            return None
        where = self.record(body["where"], f"{at}.where") if "where" in body else None
        if "where" in body and where is None:
            return None
        within = None
        if "within" in body:
            try:
                within = duration_seconds(body["within"])
            except ValueError as exc:
                self.problem(f"{at}.within", str(exc))
                return None
        path, op, value = body.get("path"), body.get("op"), body.get("value")
        if kind == "exists":
            if path or op:
                self.problem(at, "exists takes only where and within")
                return None
            return Aggregate(kind, where, within, None, ">=", 1)
        if kind in ("min", "max") and not path:
            self.problem(at, f"{kind} needs the path it takes the {kind} of")
            return None
        if op is None or op not in COMPARISONS:
            self.problem(f"{at}.op", f"{kind} needs a comparison operator (= != < <= > >=), not {op!r}")
            return None
        if kind == "count":  # compares a number of records, not a path's value
            if path:
                self.problem(f"{at}.path", "count takes no path (it counts the records where matches)")
                return None
            if not isinstance(value, int) or isinstance(value, bool):
                self.problem(f"{at}.value", "type mismatch: count compares a number of records")
                return None
            return Aggregate(kind, where, within, None, op, value)
        check = self.cmp({"path": path, "op": op, "value": value}, at)
        if check is None:
            return None
        return Aggregate(kind, where, within, path, op, check.value)


def parse_segment(data: Any, source: str) -> tuple[Segment | None, list[str]]:
    """One file's content -> (the segment or None, its problems)."""
    parser = _Parser(source)
    if not isinstance(data, dict):
        return None, [f"{source}: (top level): expected a mapping of name, description, where"]
    for key in set(data) - {"name", "description", "where"}:
        parser.problem(key, "unknown key")
    name = data.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        parser.problem("name", f"'{name}' must be lower_snake_case")
    if "where" not in data:
        parser.problem("where", "missing")
        return None, parser.problems
    where = parser.identity(data["where"], "where")
    if parser.problems or where is None:
        return None, parser.problems
    return Segment(name, str(data.get("description") or ""), where, source), []


PARSED: dict[tuple[str, int, int], tuple[Segment | None, list[str]]] = {}  # (path, mtime ns, size) -> parsed


def parsed_file(path: Path) -> tuple[Segment | None, list[str]]:
    """One definition file's segment and problems, parsed once per version of the file (a run of many tenants
    loads the shared `all/` files once, not once per tenant)."""
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in PARSED:
        try:
            PARSED[key] = parse_segment(yaml.safe_load(path.read_text()), str(path))
        except yaml.YAMLError as exc:
            PARSED[key] = (None, [f"{path}: (top level): bad syntax: {str(exc).splitlines()[0]}"])
    return PARSED[key]


def load_segments(folder: str | Path, tenant: str | None = None) -> list[Segment]:
    """The segments of `tenant`: folder/all/*.yaml and folder/<tenant>/*.yaml (every tenant's folder when
    None, for a check at load). Raises SegmentError listing every problem of every file."""
    root = Path(folder)
    dirs = (
        [
            root / "all",
            *([root / tenant] if tenant else [d for d in sorted(root.iterdir()) if d.is_dir() and d.name != "all"]),
        ]
        if root.is_dir()
        else []
    )
    segments, problems = [], []
    for path in sorted(p for d in dirs if d.is_dir() for p in d.glob("*.y*ml")):
        segment, found = parsed_file(path)
        problems += found
        if segment is not None:
            segments.append(segment)
    names = [s.name for s in segments]
    problems += [
        f"{folder}: name: segment '{n}' is defined twice" for n in sorted({n for n in names if names.count(n) > 1})
    ]
    if problems:
        raise SegmentError("\n".join(problems))
    return segments
