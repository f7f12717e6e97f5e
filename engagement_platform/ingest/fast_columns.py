"""fast_path.FastPath.decide column by column: the per-record rules of `decide_record` (the reference it is
tested against) with one Python pass per record for the JSON parse and one per field for the values;
types, formats, required fields and enums are Arrow kernels over whole columns. A record any rule
leaves to Spark is marked in `left` and dropped from the decided rows at the end."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.ingest.errors import SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.sources import CORRUPT

if TYPE_CHECKING:
    from engagement_platform.ingest.fast_path import FastPath

EMPTY: dict = {}


def decide_columns(fast: FastPath, partition: int, offsets: list[int], values: list[bytes | None]) -> tuple[pa.Table, list[int]]:
    from engagement_platform.ingest import fast_path as rules

    limit = fast.max_record_bytes

    def parsed(value):
        if not value or len(value) > limit:
            return None
        try:
            record = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
        return record if type(record) is dict and CORRUPT not in record else None

    docs = [parsed(v) for v in values]
    left = np.fromiter((d is None for d in docs), dtype=bool, count=len(docs))
    docs = [EMPTY if d is None else d for d in docs]
    canonical: dict[int, bool] = {}
    fields = fast.fields
    by_field = zip(*[tuple(map(d.get, fields)) for d in docs]) if docs else ([] for _ in fields)  # one pass, then transposed in C
    row = {name: _text_column(list(items), docs, values, left, canonical) for name, items in zip(fields, by_field)}
    for cast in fast.casts:
        source = row.get(cast.column, pa.nulls(len(values), pa.string()))
        converted = _convert(source, cast.type, left, rules)
        if cast.default_from:
            pending = _mask(pc.is_null(source))
            for name in cast.default_from:
                other = row.get(name, pa.nulls(len(values), pa.string()))
                use = pending & _mask(pc.is_valid(other))
                fallback = _as_type(pc.if_else(pa.array(use), other, pa.scalar(None, other.type)), cast.type, left, rules)
                converted = pc.if_else(pa.array(use), fallback, converted)
                pending &= ~use
        if cast.to != cast.column:
            row.pop(cast.column, None)
        row[cast.to] = converted
    out = {}
    for name, spec in fast.target.items():
        column = row.get(name, pa.nulls(len(values), rules.ARROW_TYPES[spec.type]))
        if pa.types.is_string(column.type) and spec.type != "string":
            column = _convert(column, spec.type, left, rules)
        out[name] = column
    for name in fast.required:
        missing = pc.is_null(out[name])
        if pa.types.is_string(out[name].type):
            missing = pc.or_kleene(missing, pc.equal(pc.utf8_trim(out[name], " "), ""))  # Spark's trim removes spaces only
        left |= _mask(missing)
    for name, allowed in fast.enums.items():
        left |= _mask(pc.and_kleene(pc.is_valid(out[name]), pc.invert(pc.is_in(out[name], value_set=pa.array(sorted(allowed))))))
    keep = pa.array(~left)
    table = pa.table({SOURCE_PARTITION: pa.array(np.full(len(values), partition, dtype=np.int32)),
                      SOURCE_OFFSET: pa.array(offsets, pa.int64()), **out}, schema=fast.schema())
    return table.filter(keep), np.flatnonzero(left).tolist()


def _mask(values) -> np.ndarray:
    return pc.fill_null(values, False).to_numpy(zero_copy_only=False)


def _text_column(items: list, docs: list[dict], values: list[bytes | None], left: np.ndarray, canonical: dict[int, bool]) -> pa.Array:
    """A source column's text as Spark's parse gives it, or the record marked in `left`."""
    try:
        return pa.array(items, pa.string())  # the usual case: every value a string or missing
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        pass
    from engagement_platform.ingest.fast_path import WRITTEN_BACK_OTHERWISE, _canonical

    out = []
    for index, item in enumerate(items):
        kind = type(item)
        if item is None or kind is str:
            out.append(item)
            continue
        if kind is int:
            out.append(str(item))
            continue
        if kind is bool:
            out.append("true" if item else "false")
            continue
        if kind is dict or kind is list:
            ok = canonical.get(index)
            if ok is None:
                ok = canonical[index] = _canonical(docs[index], values[index])
            if ok:
                nested = orjson.dumps(item)
                if not WRITTEN_BACK_OTHERWISE.search(nested):
                    out.append(nested.decode())
                    continue
        left[index] = True
        out.append(None)
    return pa.array(out, pa.string())


def _convert(text: pa.Array, type_: str, left: np.ndarray, rules) -> pa.Array:
    """Text -> `type_` for the values of a certain form; others mark their record in `left` (nulls stay null)."""
    arrow = rules.ARROW_TYPES[type_]
    if not pa.types.is_string(text.type):
        left |= _mask(pc.is_valid(text))  # typed by an earlier converter: left to Spark, as decide_record does
        return pa.nulls(len(text), arrow)
    if type_ == "string":
        return text
    pattern = {"timestamp": rules.TIMESTAMP, "date": rules.DATE}.get(type_, rules.INTEGER).pattern
    certain = pc.fill_null(pc.match_substring_regex(text, f"^(?:{pattern})$"), False)
    left |= _mask(pc.and_kleene(pc.is_valid(text), pc.invert(certain)))
    candidates = pc.if_else(certain, text, pa.scalar(None, pa.string()))
    if type_ == "timestamp":
        zoned = pc.fill_null(pc.match_substring_regex(candidates, r"(Z|[+-]\d\d:\d\d)$"), True)
        candidates = pc.if_else(zoned, candidates, pc.binary_join_element_wise(candidates, "Z", ""))  # the session zone: UTC
    try:
        converted = pc.cast(candidates, pa.int64() if type_ in rules.INT_TYPES else arrow)
    except pa.ArrowInvalid:  # a calendar date that does not exist: value by value, as decide_record does
        scalar = rules._timestamp if type_ == "timestamp" else (lambda t: rules._convert(t, type_))
        items = [None if t is None else scalar(t) for t in text.to_pylist()]
        for index, item in enumerate(items):
            if item is rules.UNDECIDED:
                left[index] = True
        return pa.array([None if item is rules.UNDECIDED else item for item in items], arrow)
    if arrow == pa.int32():
        bound = rules.INT_TYPES[type_][1]
        outside = pc.and_kleene(pc.is_valid(converted), pc.or_kleene(pc.less(converted, -bound), pc.greater_equal(converted, bound)))
        left |= _mask(outside)
        converted = pc.cast(pc.if_else(outside, pa.scalar(None, pa.int64()), converted), arrow)
    return converted


def _as_type(text: pa.Array, type_: str, left: np.ndarray, rules) -> pa.Array:
    """builtin._as over a column: a date is the UTC day of a timestamp (or a bare date)."""
    if type_ != "date" or not pa.types.is_string(text.type):
        return _convert(text, type_, left, rules)
    bare = pc.fill_null(pc.match_substring_regex(text, f"^(?:{rules.DATE.pattern})$"), False)
    dates = _convert(pc.if_else(bare, text, pa.scalar(None, pa.string())), "date", left, rules)
    stamps = _convert(pc.if_else(bare, pa.scalar(None, pa.string()), text), "timestamp", left, rules)
    return pc.if_else(bare, dates, pc.cast(stamps, pa.date32()))
