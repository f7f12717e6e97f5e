"""The record format's contract (docs/reference/record-format.md) in plain Python, one record at a time.

Slow and literal on purpose: each rule of the docs page is written out here once, with Python's own tools
(explicit regexes, date and datetime constructors, `re`), so that a property test can hold the vectorized
plan (ingest/vector_plan.py, DuckDB SQL) to it row by row. Nothing here comes from the plan's modules
(sql_types, sql_steps, vector_plan), and nothing here runs DuckDB.

    run_reference(pipeline, [(row_id, partition, offset, raw bytes or None), ...]) -> [ReferenceRow, ...]

Every stage computes its outputs on every record, as the plan's projections do; a stage's errors are
recorded only on a record that is still clean (converters in order, then conform, then every validator at
once). The typed values of a rejected record are therefore whatever the stages made of it.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

from engagement_platform.ingest import builtin
from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.ingest.pipeline import Pipeline

JSON_FORMATS = ("kafka", "jsonl", "json")
MALFORMED_VALUE_CHARS = 200

# ---- JSON: RFC 8259 plus the reader's tolerances ---------------------------------------------------

JSON_SPACE = " \t\n\r"
NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
INTEGER_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)")
# Tolerated: NaN and Infinity (also Inf), in any case, with an optional minus sign
NON_FINITE = re.compile(r"-?(nan|inf(inity)?)", re.IGNORECASE)
# A string token: unescaped characters other than controls, or one of RFC 8259's escapes
STRING = re.compile(r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
LITERALS = {"true": True, "false": False, "null": None}


class Malformed(ValueError):
    """The text is not JSON by the reader's rules."""


@dataclass(frozen=True)
class Number:
    token: str  # as written in the record


@dataclass(frozen=True)
class Object:
    pairs: tuple[tuple[str, object], ...]  # every key in its order, duplicates included


class JsonReader:
    """A recursive-descent reader of one JSON text (RFC 8259 grammar, plus trailing commas and NaN/Infinity)."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def document(self) -> object:
        self.skip_space()
        value = self.value()
        self.skip_space()
        if self.pos != len(self.text):
            raise Malformed("content after the value")
        return value

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in JSON_SPACE:
            self.pos += 1

    def peek(self) -> str:
        return self.text[self.pos : self.pos + 1]

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise Malformed(f"expected {char!r} at {self.pos}")
        self.pos += 1

    def value(self) -> object:
        char = self.peek()
        if char == "{":
            return self.object()
        if char == "[":
            return self.array()
        if char == '"':
            return self.string()
        for word, value in LITERALS.items():
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return value
        token = NUMBER.match(self.text, self.pos) or NON_FINITE.match(self.text, self.pos)
        if token is None:
            raise Malformed(f"no value at {self.pos}")
        self.pos = token.end()
        return Number(token.group())

    def string(self) -> str:
        token = STRING.match(self.text, self.pos)
        if token is None:
            raise Malformed(f"bad string at {self.pos}")
        self.pos = token.end()
        decoded = json.loads(token.group())  # resolves the escapes; a surrogate pair becomes one character
        if any("\ud800" <= char <= "\udfff" for char in decoded):
            raise Malformed("an escaped surrogate without its pair")  # no UTF-8 text can hold it
        return decoded

    def object(self) -> Object:
        self.expect("{")
        pairs: list[tuple[str, object]] = []
        self.skip_space()
        if self.peek() == "}":
            self.pos += 1
            return Object(())
        while True:
            key = self.string()
            self.skip_space()
            self.expect(":")
            self.skip_space()
            pairs.append((key, self.value()))
            self.skip_space()
            if self.peek() == "}":
                self.pos += 1
                return Object(tuple(pairs))
            self.expect(",")
            self.skip_space()
            if self.peek() == "}":  # a trailing comma
                self.pos += 1
                return Object(tuple(pairs))

    def array(self) -> list[object]:
        self.expect("[")
        items: list[object] = []
        self.skip_space()
        if self.peek() == "]":
            self.pos += 1
            return items
        while True:
            items.append(self.value())
            self.skip_space()
            if self.peek() == "]":
                self.pos += 1
                return items
            self.expect(",")
            self.skip_space()
            if self.peek() == "]":  # a trailing comma
                self.pos += 1
                return items


def number_text(token: str) -> str:
    """A JSON number's text: integers as written (-0 is 0), NaN/Infinity and numbers too large for a
    double as written, any other number as the shortest text of its double (Python's repr)."""
    if NON_FINITE.fullmatch(token):
        return token
    if INTEGER_NUMBER.fullmatch(token):
        return str(int(token))
    value = float(token)
    return token if math.isinf(value) else repr(value)


def nested_number_text(token: str) -> str:
    """A number inside an object or array, as the JSON writer writes it: integers, NaN/Infinity and numbers too
    large for a double as `number_text` does; any other number in JavaScript's style (shortest digits,
    decimal notation while the point is at most 21 digits in and at most 6 zeros after it, else an
    exponent), with a '.0' on an integral value and no '+' in the exponent."""
    value = float(token)
    if NON_FINITE.fullmatch(token) or INTEGER_NUMBER.fullmatch(token) or math.isinf(value):
        return number_text(token)
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0.0"
    shortest = Decimal(repr(abs(value))).normalize().as_tuple()  # Python's repr: the shortest digits
    digits = "".join(str(d) for d in shortest.digits)
    k, n = len(digits), len(digits) + int(shortest.exponent)  # n: where the decimal point goes
    if k <= n <= 21:
        return f"{sign}{digits}{'0' * (n - k)}.0"
    if 0 < n <= 21:
        return f"{sign}{digits[:n]}.{digits[n:]}"
    if -6 < n <= 0:
        return f"{sign}0.{'0' * -n}{digits}"
    mantissa = digits[0] + (f".{digits[1:]}" if k > 1 else "")
    return f"{sign}{mantissa}e{n - 1}"


# A string in compact JSON: the two mandatory escapes, the short control escapes, other controls as
# \u00XX (upper-case hex); everything else (non-ASCII, '/', DEL) as itself.
SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def quoted(text: str) -> str:
    return '"' + "".join(SHORT_ESCAPES.get(c) or (f"\\u{ord(c):04X}" if c < " " else c) for c in text) + '"'


def compact(value: object) -> str:
    """A JSON value as compact JSON: no whitespace, keys in their order (duplicates kept), numbers as
    `nested_number_text` writes them."""
    if isinstance(value, Object):
        return "{" + ",".join(f"{quoted(k)}:{compact(v)}" for k, v in value.pairs) + "}"
    if isinstance(value, list):
        return "[" + ",".join(compact(v) for v in value) + "]"
    if isinstance(value, str):
        return quoted(value)
    if isinstance(value, Number):
        return nested_number_text(value.token)
    return {True: "true", False: "false", None: "null"}[value]  # type: ignore[index]


def source_text(value: object) -> str | None:
    """A source column's text: strings decoded, true/false, numbers by `number_text`, nested values as
    compact JSON; null (or an absent key) is None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Number):
        return number_text(value.token)
    return compact(value)


def read_object(text: str) -> dict[str, str | None] | None:
    """The record's top-level keys and their texts (the first occurrence of a key wins); None when the
    text is not JSON or its top level is not an object."""
    try:
        document = JsonReader(text).document()
    except Malformed:
        return None
    if not isinstance(document, Object):
        return None
    fields: dict[str, str | None] = {}
    for key, value in document.pairs:
        fields.setdefault(key, source_text(value))
    return fields


# ---- text to types ---------------------------------------------------------------------------------

INTEGER_RANGES = {
    "short": 16,
    "int": 32,
    "integer": 32,
    "long": 64,
    "bigint": 64,
}
INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
DECIMAL_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
TRUE_WORDS = ("true", "t", "yes", "y", "1")
FALSE_WORDS = ("false", "f", "no", "n", "0")
TIMESTAMP_TEXT = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
    r"([T ](?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})(:(?P<second>[0-9]{2})(\.(?P<fraction>[0-9]{1,6}))?)?"
    r"(?P<offset>Z|(?P<sign>[+-])(?P<offset_hours>[0-9]{2}):(?P<offset_minutes>[0-9]{2}))?)?"
)
# Pattern letters of `formats`: (field, fewest digits, most digits); a field takes as many digits as it
# can (up to its most) and never gives any back
PATTERN_FIELDS = {
    "yyyy": ("year", 4, 4),
    "MM": ("month", 1, 2),
    "dd": ("day", 1, 2),
    "HH": ("hour", 1, 2),
    "mm": ("minute", 1, 2),
    "ss": ("second", 1, 2),
}
PATTERN_LITERALS = set("-/ :.,")


def same_type(have: str, want: str) -> bool:
    return have == want or INTEGER_RANGES.get(have, -1) == INTEGER_RANGES.get(want, -2)


def to_integer(text: str, type_: str) -> int | None:
    text = text.strip(" ")
    if not INTEGER_TEXT.fullmatch(text):
        return None
    value, bits = int(text), INTEGER_RANGES[type_]
    return value if -(2 ** (bits - 1)) <= value < 2 ** (bits - 1) else None


def to_float32(value: float) -> float | None:
    """The double rounded to the nearest float (as C rounds), None when that is infinite."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return None


def to_decimal(text: str, type_: str) -> float | None:
    text = text.strip(" ")
    if not DECIMAL_TEXT.fullmatch(text):
        return None
    value: float | None = float(text)
    if type_ == "float":
        value = to_float32(value)
    return value if value is not None and math.isfinite(value) else None


def lower(text: str) -> str:
    """Lower case character by character with Unicode's simple mapping, as DuckDB's lower() does: `İ` is `i`
    (Python's str.lower gives `i̇`) and a capital sigma is `σ` wherever it stands (Python ends a word with `ς`)."""
    return "".join("i" if char == "\u0130" else char.lower() for char in text)


def to_boolean(text: str) -> bool | None:
    word = lower(text.strip(" "))
    return True if word in TRUE_WORDS else False if word in FALSE_WORDS else None


@dataclass(frozen=True)
class TimestampText:
    day: date  # as written
    clock: time
    offset: timedelta  # zero when the text has none (UTC)

    def instant(self) -> datetime | None:
        """The UTC instant, None outside years 0001-9999 (an offset can push it out)."""
        try:
            return datetime.combine(self.day, self.clock, tzinfo=timezone(self.offset)).astimezone(UTC)
        except OverflowError:
            return None


def read_timestamp_text(text: str) -> TimestampText | None:
    found = TIMESTAMP_TEXT.fullmatch(text.strip(" "))
    if found is None:
        return None
    part = found.groupdict()

    def number(name: str) -> int:
        return int(part[name] or 0)  # an absent time part is zero

    if number("offset_hours") > 23 or number("offset_minutes") > 59:
        return None
    try:
        day = date(number("year"), number("month"), number("day"))  # no year 0, no 2026-02-30
        micros = int((part["fraction"] or "0").ljust(6, "0"))
        clock = time(number("hour"), number("minute"), number("second"), micros)  # no hour 24, no second 60
    except ValueError:
        return None
    offset = timedelta(hours=number("offset_hours"), minutes=number("offset_minutes"))
    return TimestampText(day, clock, -offset if part["sign"] == "-" else offset)


def read_with_pattern(text: str, pattern: str) -> datetime | None:
    """The text read with one `formats` pattern (a wall-clock time, taken as UTC), None when it does not fit."""
    fields: dict[str, int] = {}
    pos, rest = 0, pattern
    while rest:
        letters = next((token for token in PATTERN_FIELDS if rest.startswith(token)), None)
        if letters is not None:
            name, fewest, most = PATTERN_FIELDS[letters]
            digits = re.compile(f"[0-9]{{{fewest},{most}}}").match(text, pos)
            if digits is None:
                return None
            fields[name], pos, rest = int(digits.group()), digits.end(), rest[len(letters) :]
        elif rest[0] in PATTERN_LITERALS:
            if text[pos : pos + 1] != rest[0]:
                return None
            pos, rest = pos + 1, rest[1:]
        else:
            raise NotImplementedError(f"pattern letter {rest[0]!r} of {pattern!r} is outside the contract")
    if pos != len(text):
        return None
    if not {"year", "month", "day"} <= set(fields):
        raise NotImplementedError(f"pattern {pattern!r} without yyyy, MM and dd is outside the contract")
    try:
        return datetime(tzinfo=UTC, **{"hour": 0, "minute": 0, "second": 0, **fields})
    except ValueError:
        return None


def text_to(text: str, type_: str, formats: list[str] | None = None) -> object:
    """A text as a value of `type_`, None when it does not fit (docs: Text to types)."""
    if type_ == "string":
        return text
    if type_ in INTEGER_RANGES:
        return to_integer(text, type_)
    if type_ in ("double", "float"):
        return to_decimal(text, type_)
    if type_ == "boolean":
        return to_boolean(text)
    if type_ in ("date", "timestamp") and formats:
        trimmed = text.strip(" ")
        stamp = next(filter(None, (read_with_pattern(trimmed, p) for p in formats)), None)
        return stamp.date() if stamp is not None and type_ == "date" else stamp
    if type_ in ("date", "timestamp"):
        parts = read_timestamp_text(text)
        if parts is None:
            return None
        return parts.day if type_ == "date" else parts.instant()
    raise NotImplementedError(f"type {type_} is outside the contract")


def convert(value: object, have: str, want: str, formats: list[str] | None = None) -> object:
    """A value of type `have` as `want`: text by the rules, a timestamp to its UTC day."""
    if value is None:
        return None
    if same_type(have, want):
        return value
    if have == "string":
        return text_to(value, want, formats)  # type: ignore[arg-type]
    if have == "timestamp" and want == "date":
        return value.date()  # type: ignore[attr-defined] - a UTC instant, so its UTC day
    raise NotImplementedError(f"{have} -> {want} is outside the contract")


def float32_text(value: float) -> str:
    """The shortest text that reads back as the same float, in Python's repr style."""
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if to_float32(float(text)) == value:
            return repr(float(text))
    raise AssertionError(f"no float text for {value!r}")


def as_text(value: object, type_: str) -> str:
    """A typed value as messages quote it: ISO dates, timestamps as UTC with microseconds."""
    if type_ == "timestamp":
        stamp = value.astimezone(UTC)  # type: ignore[attr-defined]
        return f"{stamp.date().isoformat()}T{stamp.strftime('%H:%M:%S.%f')}Z"
    if type_ == "date":
        return value.isoformat()  # type: ignore[attr-defined]
    if type_ == "boolean":
        return "true" if value else "false"
    if type_ == "float":
        return float32_text(value)  # type: ignore[arg-type]
    return repr(value) if type_ == "double" else str(value)


def type_hint(formats: list[str] | None) -> str:
    return f" (formats: {', '.join(formats)})" if formats else ""


# ---- the pipeline, one record at a time -------------------------------------------------------------


@dataclass
class ReferenceRow:
    row_id: int
    partition: int
    offset: int
    values: dict[str, object]  # every target column, typed
    errors: list[dict[str, str | None]]
    raw: bytes | None  # only on a rejected record
    input: dict[str, str | None] | None  # only on a rejected record that parsed


@dataclass
class Columns:
    """The columns a record has while it goes through the stages, with their types."""

    values: dict[str, object]
    types: dict[str, str]

    def set(self, name: str, value: object, type_: str) -> None:
        self.values[name], self.types[name] = value, type_

    def drop(self, name: str) -> None:
        self.values.pop(name, None)
        self.types.pop(name, None)


def error(stage: str, plugin: str, column: str | None, code: str, message: str, value: str | None = None) -> dict:
    return {
        "stage": stage,
        "plugin": plugin,
        "column_name": column,
        "error_code": code,
        "message": message,
        "value": value,
    }


def parse(raw: bytes | None, config: PipelineConfig) -> tuple[dict[str, str | None] | None, list[dict]]:
    """(the record's source columns, or None when it did not parse; its parse errors)."""
    source = config.source
    if source.format not in (*JSON_FORMATS, "csv"):
        raise NotImplementedError(f"a {source.format} source is outside the contract")
    limit = source.max_record_bytes
    if raw is None or len(raw) == 0:
        return None, [error("parse", "parser", None, "empty_record", "record has no content")]
    if len(raw) > limit:
        return None, [error("parse", "parser", None, "oversized", f"record is {len(raw)} bytes, limit {limit}")]
    try:
        text: str | None = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None  # no text to quote: the raw bytes are in the quarantine
    if source.format == "csv":
        sep = str(source.options.get("sep", source.options.get("delimiter", ",")))
        quote = str(source.options.get("quote", '"'))
        values = read_csv_line(text, sep, quote) if text is not None else None
        fields = dict(zip(source.columns, values)) if values and len(values) == len(source.columns) else None
        expected = f"a CSV line with {len(source.columns)} fields"
    else:
        fields = read_object(text) if text is not None else None
        expected = "one JSON object"
    if fields is None:
        shown = text[:MALFORMED_VALUE_CHARS] if text is not None else None
        return None, [error("parse", "parser", None, "malformed_record", f"record is not {expected}", shown)]
    return {column: fields.get(column) for column in source.columns}, []


def read_csv_line(text: str, sep: str, quote: str) -> list[str | None] | None:
    """A CSV line's fields, read a character at a time (RFC 4180): a field is plain (no separator, no quote;
    empty is null) or quoted (a doubled quote inside is one quote; empty is ''). None when a quote is left
    open, or anything but a separator follows a field (a quote inside a plain field, text after a closing one)."""
    values: list[str | None] = []
    at = 0
    while True:
        if at < len(text) and text[at] == quote:
            chars, at = [], at + 1
            while True:
                if at == len(text):
                    return None  # the quote is never closed
                if text[at] == quote and text[at + 1 : at + 2] == quote:
                    chars.append(quote)
                    at += 2
                elif text[at] == quote:
                    at += 1
                    break
                else:
                    chars.append(text[at])
                    at += 1
            values.append("".join(chars))
        else:
            start = at
            while at < len(text) and text[at] not in (sep, quote):
                at += 1
            values.append(text[start:at] or None)
        if at == len(text):
            return values
        if text[at] != sep:
            return None
        at += 1


def conversion_error(
    plugin: str, name: str, value: object, have: str, want: str, formats: list[str] | None = None
) -> dict:
    shown = as_text(value, have)
    message = f"'{shown}' is not a valid {want}{type_hint(formats)}"
    return error("convert", plugin, name, "wrong_type", message, shown)


def rename(p: builtin.Rename, row: Columns) -> list[dict]:
    value, type_ = row.values[p.params.from_], row.types[p.params.from_]
    row.drop(p.params.from_)
    row.set(p.params.to, value, type_)
    return []


def concat(p: builtin.Concat, row: Columns) -> list[dict]:
    parts = [row.values[c] for c in p.params.columns]
    row.set(p.params.to, p.params.separator.join(str(v) for v in parts if v is not None), "string")
    if p.params.required and all(v is None for v in parts):
        message = f"none of {', '.join(p.params.columns)} has a value"
        return [error("convert", p.name, p.params.to, "missing_value", message)]
    return []


def split(p: builtin.Split, row: Columns) -> list[dict]:
    """At most len(into) parts, the rest joined into the last; a missing part is null."""
    value, into, sep = row.values[p.params.column], p.params.into, p.params.separator
    parts = value.strip(" ").split(sep, len(into) - 1) if value is not None else []
    for i, name in enumerate(into):
        row.set(name, parts[i] if i < len(parts) else None, "string")
    need = p.params.min_parts or len(into)
    if value is None or len(parts) < need:
        shown = "null" if value is None else value
        message = f"'{shown}' does not split into {need} parts on '{sep}'"
        return [error("convert", p.name, p.params.column, "split_mismatch", message, value)]
    return []


def default_as(row: Columns, name: str, type_: str) -> object:
    """A `default_from` fallback as `type_`: a date from a timestamp text is that instant's UTC day."""
    if type_ == "date" and row.types[name] == "string":
        return convert(convert(row.values[name], "string", "timestamp"), "timestamp", "date")
    return convert(row.values[name], row.types[name], type_)


def cast(p: builtin.Cast, row: Columns) -> list[dict]:
    name, type_, formats = p.params.column, p.params.type, p.params.formats
    value, have = row.values[name], row.types[name]
    converted = convert(value, have, type_, formats)
    if value is None and p.params.default_from:
        converted = next((v for v in (default_as(row, c, type_) for c in p.params.default_from) if v is not None), None)
    if p.params.to and p.params.to != name:
        row.drop(name)
    row.set(p.params.to or name, converted, type_)
    if value is not None and convert(value, have, type_, formats) is None:
        return [conversion_error(p.name, name, value, have, type_, formats)]
    return []


def map_values(p: builtin.MapValues, row: Columns) -> list[dict]:
    def key(text: str) -> str:
        return text if p.params.case_sensitive else lower(text)

    table = {key(k): v for k, v in p.params.mapping.items()}
    value = row.values[p.params.column]
    mapped = table.get(key(value), p.params.default) if value is not None else p.params.default
    row.set(p.params.to or p.params.column, mapped, "string")
    if value is not None and mapped is None:
        message = f"'{value}' has no mapping (known: {', '.join(p.params.mapping)})"
        return [error("convert", p.name, p.params.column, "unmapped_value", message, value)]
    return []


def coalesce(p: builtin.Coalesce, row: Columns) -> list[dict]:
    """The first present value converts or is an error; later ones are not looked at."""
    names = (p.params.column, *p.params.sources)
    type_ = p.params.type or row.types.get(p.params.column, "string")
    present = [n for n in names if row.values[n] is not None]
    converted = [convert(row.values[n], row.types[n], type_) for n in names]
    errors = []
    if p.params.type and present and converted[names.index(present[0])] is None:
        first = present[0]
        errors.append(conversion_error(p.name, first, row.values[first], row.types[first], type_))
    row.set(p.params.column, next((v for v in converted if v is not None), None), type_)
    return errors


def conform(target: dict, row: Columns) -> list[dict]:
    """Every target column gets its type; all its wrong types are reported together."""
    errors = []
    for name, spec in target.items():
        have = row.types[name]
        if have == spec.type:
            continue
        value = row.values[name]
        converted = convert(value, have, spec.type, spec.formats)
        row.set(name, converted, spec.type)
        if value is not None and converted is None:
            errors.append(conversion_error("conform", name, value, have, spec.type, spec.formats))
    return errors


def required(p: builtin.Required, row: Columns) -> list[dict]:
    errors = []
    for name in p.params.columns:
        value = row.values[name]
        blank = row.types[name] == "string" and not p.params.allow_blank and value is not None
        if value is None or (blank and value.strip(" ") == ""):
            message = f"required field '{name}' is missing or empty"
            errors.append(error("validate", p.name, name, "missing_required", message))
    return errors


def enum(p: builtin.Enum, row: Columns) -> list[dict]:
    value = row.values[p.params.column]
    if value is None or value in p.params.values:
        return []
    message = f"'{value}' is not one of {', '.join(p.params.values)}"
    return [error("validate", p.name, p.params.column, "not_in_enum", message, value)]


def shown_bound(bound: float | str | None) -> str:
    if bound is None:
        return ""
    return str(int(bound)) if isinstance(bound, float) and bound.is_integer() else str(bound)


def typed_bound(bound: float | str, type_: str) -> object:
    """A range bound as the column's type: numbers as given, ISO dates, ISO timestamps (no offset is UTC)."""
    if isinstance(bound, float):
        return bound
    if type_ == "date":
        return date.fromisoformat(bound)
    stamp = datetime.fromisoformat(bound)
    return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp


def range_(p: builtin.Range, row: Columns) -> list[dict]:
    name = p.params.column
    value, type_ = row.values[name], row.types[name]
    low, high = p.params.min, p.params.max
    if value is None:
        return []
    below = low is not None and value < typed_bound(low, type_)  # type: ignore[operator]
    above = high is not None and value > typed_bound(high, type_)  # type: ignore[operator]
    if not (below or above):
        return []
    shown = as_text(value, type_)
    message = f"{shown} is outside [{shown_bound(low)}, {shown_bound(high)}]"
    return [error("validate", p.name, name, "out_of_range", message, shown)]


RE2_SPACE = "\\t\\n\\f\\r "  # RE2's \s: no vertical tab, unlike Python's
RE2_FLAGS_THAT_MATTER = re.compile(r"\(\?[a-zA-Z-]*[msU]")  # multi-line, dot-all, ungreedy


def python_escape(escape: str, in_class: bool) -> str:
    if escape == "\\s":
        return RE2_SPACE if in_class else f"[{RE2_SPACE}]"
    if escape == "\\S" and not in_class:
        return f"[^{RE2_SPACE}]"
    if escape in ("\\S", "\\Z", "\\z"):
        raise NotImplementedError(f"{escape} is outside the reference")
    return escape


def python_pattern(pattern: str) -> str:
    """An RE2 pattern as Python's `re` reads it with re.ASCII: the differences that matter spelled out
    (`\\s` has no vertical tab; `$` is the end of the text, never the place before a final newline)."""
    if RE2_FLAGS_THAT_MATTER.search(pattern):
        raise NotImplementedError(f"pattern {pattern!r}: its flags are outside the reference")
    out, i, in_class = [], 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            out.append(python_escape(pattern[i : i + 2], in_class))
            i += 2
        elif char == "[" and not in_class:  # a class opens: '[' or '[^', then a ']' that is a literal
            start = i + 1 + (pattern[i + 1 : i + 2] == "^")
            start += pattern[start : start + 1] == "]"
            out.append(pattern[i:start])
            i, in_class = start, True
        else:
            in_class = in_class and char != "]"
            out.append(r"\Z" if char == "$" and not in_class else char)
            i += 1
    return "".join(out)


def regex(p: builtin.Regex, row: Columns) -> list[dict]:
    value = row.values[p.params.column]
    if value is None or re.search(python_pattern(p.params.pattern), value, re.ASCII):
        return []
    message = f"'{value}' does not match {p.params.pattern}"
    return [error("validate", p.name, p.params.column, "pattern_mismatch", message, value)]


CONVERTERS = {
    builtin.Rename: rename,
    builtin.Concat: concat,
    builtin.Split: split,
    builtin.Cast: cast,
    builtin.MapValues: map_values,
    builtin.Coalesce: coalesce,
}
VALIDATORS = {builtin.Required: required, builtin.Enum: enum, builtin.Range: range_, builtin.Regex: regex}


def run_record(pipeline: Pipeline, raw: bytes | None) -> tuple[dict, list[dict], dict | None]:
    """(typed target values, errors, parsed source columns or None) of one record."""
    config = pipeline.config
    source, errors = parse(raw, config)
    row = Columns(dict(source or dict.fromkeys(config.source.columns)), dict.fromkeys(config.source.columns, "string"))
    for converter in pipeline.converters:
        found = CONVERTERS[type(converter)](converter, row)
        errors = errors or found  # a record that failed goes no further: later stages add no errors
    found = conform(config.target.columns, row)
    errors = errors or found
    found = [e for v in pipeline.validators for e in VALIDATORS[type(v)](v, row)]
    errors = errors or found
    return {name: row.values[name] for name in config.target.columns}, errors, source


def run_reference(
    pipeline: Pipeline | PipelineConfig, records: list[tuple[int, int, int, bytes | None]]
) -> list[ReferenceRow]:
    if isinstance(pipeline, PipelineConfig):
        pipeline = Pipeline.from_config(pipeline)
    rows = []
    for row_id, partition, offset, raw in records:
        values, errors, source = run_record(pipeline, raw)
        rejected = bool(errors)
        rows.append(
            ReferenceRow(
                row_id,
                partition,
                offset,
                values,
                errors,
                raw if rejected else None,
                source if rejected else None,
            )
        )
    return rows
