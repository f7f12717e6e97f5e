"""Text -> typed value, as DuckDB SQL: the conversion rules of the vectorized record path (docs/reference/
record-format.md). Each rule first checks the text's shape with a full-match regex, then casts: DuckDB's
casts alone accept more than the rules say ('0x10' as an int, '24:00' as a time), and the shape check is
what makes the path equal to its reference (engagement_platform_tests/ingest/reference.py).

Nothing here depends on the session's time zone (a Spark executor's may be anything): a timestamp text is
rewritten with an explicit offset before its cast, and a timestamp is read back through `timezone('UTC', ...)`."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime

from engagement_platform.ingest.sql_let import once

INTEGERS = {"int": "INTEGER", "integer": "INTEGER", "short": "SMALLINT", "long": "BIGINT", "bigint": "BIGINT"}
SQL_TYPES = {
    **INTEGERS,
    "string": "VARCHAR",
    "boolean": "BOOLEAN",
    "double": "DOUBLE",
    "float": "FLOAT",
    "date": "DATE",
    "timestamp": "TIMESTAMPTZ",
}
INTEGER_TEXT = r" *[+-]?[0-9]+ *"
DECIMAL_TEXT = r" *[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)? *"
# A timestamp text's parts, captured in this order: date, HH:MM, :SS with its fraction, offset.
TIMESTAMP_PARTS = ("date", "clock", "seconds", "offset")
TIMESTAMP_TEXT = (
    r"^ *([0-9]{4}-[0-9]{2}-[0-9]{2})"
    r"(?:[T ]((?:[01][0-9]|2[0-3]):[0-5][0-9])(:[0-5][0-9](?:\.[0-9]{1,6})?)?"
    r"(Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?)? *$"
)
# Instants and days a typed column holds: years 0001-9999, as in Spark (the proleptic calendar has no year 0)
FIRST_INSTANT, LAST_INSTANT = (
    "TIMESTAMPTZ '0001-01-01 00:00:00+00:00'",
    "TIMESTAMPTZ '9999-12-31 23:59:59.999999+00:00'",
)
FIRST_DAY = "DATE '0001-01-01'"
TRUE_WORDS = ("true", "t", "yes", "y", "1")
FALSE_WORDS = ("false", "f", "no", "n", "0")
# Spark datetime pattern letters the vectorized path translates (others keep the pipeline on Spark)
PATTERN_PARTS = {"yyyy": ("%Y", "[0-9]{4}"), "MM": ("%m", "[0-9]{1,2}"), "dd": ("%d", "[0-9]{1,2}"),
                 "HH": ("%H", "[0-9]{1,2}"), "mm": ("%M", "[0-9]{1,2}"), "ss": ("%S", "[0-9]{1,2}")}  # fmt: skip
PATTERN_LITERALS = set("-/ :.,T")


def literal(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def matches(expr: str, pattern: str) -> str:
    return f"regexp_full_match({expr}, {literal(pattern)})"


class NoSqlForm(ValueError):
    """This conversion has no vectorized form: the pipeline runs on Spark."""


def translate_pattern(pattern: str) -> tuple[str, str]:
    """A Spark datetime pattern -> (strptime format, full-match regex of its text)."""
    fmt, regex, rest = [], [], pattern
    while rest:
        for token, (code, shape) in PATTERN_PARTS.items():
            if rest.startswith(token):
                fmt.append(code)
                regex.append(shape)
                rest = rest[len(token) :]
                break
        else:
            if rest[0] not in PATTERN_LITERALS:
                raise NoSqlForm(f"pattern '{pattern}': '{rest[0]}' has no vectorized form")
            fmt.append(rest[0].replace("%", "%%"))
            regex.append(re.escape(rest[0]))
            rest = rest[1:]
    missing = [token for token in ("yyyy", "MM", "dd") if token not in pattern]
    if missing:  # DuckDB would fill them from 1900-01-01, Spark from 1970-01-01
        raise NoSqlForm(f"pattern '{pattern}' has no {', '.join(missing)}: no vectorized form")
    return "".join(fmt), "".join(regex)


def text_to(expr: str, type_: str, formats: list[str] | None = None) -> str:
    """SQL: the text `expr` as `type_`, NULL when it does not have the type's shape or value."""
    if type_ == "string":
        return expr
    trimmed = f"trim({expr}, ' ')"
    if type_ in INTEGERS:
        return f"CASE WHEN {matches(expr, INTEGER_TEXT)} THEN TRY_CAST({trimmed} AS {INTEGERS[type_]}) END"
    if type_ in ("double", "float"):
        number = f"TRY_CAST({trimmed} AS DOUBLE)"
        value = number if type_ == "double" else f"TRY_CAST({number} AS FLOAT)"
        return f"CASE WHEN {matches(expr, DECIMAL_TEXT)} AND isfinite({value}) THEN {value} END"
    if type_ == "boolean":
        word = f"lower({trimmed})"
        yes, no = (", ".join(literal(w) for w in words) for words in (TRUE_WORDS, FALSE_WORDS))
        return f"CASE WHEN {word} IN ({yes}) THEN true WHEN {word} IN ({no}) THEN false END"
    if type_ in ("date", "timestamp") and formats:
        return patterned(trimmed, type_, formats)
    if type_ == "date":  # the date as written, whatever time follows it
        day = once(f"TRY_CAST(({timestamp_parts(expr)}).date AS DATE)")
        return f"CASE WHEN {day} >= {FIRST_DAY} THEN {day} END"
    if type_ == "timestamp":
        instant = once(f"TRY_CAST({explicit_offset(timestamp_parts(expr))} AS TIMESTAMPTZ)")
        return f"CASE WHEN {instant} BETWEEN {FIRST_INSTANT} AND {LAST_INSTANT} THEN {instant} END"
    raise NoSqlForm(f"type {type_} has no vectorized conversion")


def timestamp_parts(expr: str) -> str:
    """SQL: a struct of the timestamp text's parts (TIMESTAMP_PARTS), each '' when absent or the text has
    another shape; one regex match per row, however often the parts are read."""
    names = ", ".join(literal(name) for name in TIMESTAMP_PARTS)
    return once(f"regexp_extract({expr}, {literal(TIMESTAMP_TEXT)}, [{names}])")


def explicit_offset(parts: str) -> str:
    """SQL: the parts as 'YYYY-MM-DD HH:MM:SS[.f]+HH:MM', NULL for another shape or year 0000. DuckDB's cast
    reads a text without an offset in the session's time zone, and refuses 'HH:MM' followed by an offset: both
    are spelled out here, so the cast sees one form only."""
    clock = f"CASE WHEN {parts}.clock = '' THEN '00:00' ELSE {parts}.clock END"
    seconds = f"CASE WHEN {parts}.seconds = '' THEN ':00' ELSE {parts}.seconds END"
    offset = f"CASE WHEN {parts}.offset IN ('', 'Z') THEN '+00:00' ELSE {parts}.offset END"
    # '' (another shape) and year 0000 sort below '0001': an offset could carry 0000-12-31 into year 1
    written = f"{parts}.date >= '0001'"
    return f"CASE WHEN {written} THEN {parts}.date || ' ' || {clock} || {seconds} || {offset} END"


def patterned(trimmed: str, type_: str, formats: list[str]) -> str:
    """SQL: the trimmed text read with the first of `formats` it fits (a wall-clock time in UTC)."""
    tried = []
    for pattern in formats:
        fmt, shape = translate_pattern(pattern)
        tried.append(f"CASE WHEN {matches(trimmed, shape)} THEN try_strptime({trimmed}, {literal(fmt)}) END")
    stamp = once(f"coalesce({', '.join(tried)})")
    if type_ == "date":
        day = once(f"CAST({stamp} AS DATE)")
        return f"CASE WHEN {day} >= {FIRST_DAY} THEN {day} END"
    return f"CASE WHEN {stamp} >= TIMESTAMP '0001-01-01' THEN timezone('UTC', {stamp}) END"


def convert(expr: str, have: str, want: str, formats: list[str] | None = None) -> str:
    """SQL: a column of type `have` as `want` (text by the rules above; a timestamp to its UTC day)."""
    if have == want or (have in INTEGERS and want in INTEGERS and INTEGERS[have] == INTEGERS[want]):
        return expr
    if have == "string":  # once: a step reads a conversion for its output and again for its wrong_type check
        return once(text_to(expr, want, formats))
    if have == "timestamp" and want == "date":
        return utc_day(expr)
    raise NoSqlForm(f"{have} -> {want} has no vectorized conversion")


def as_text(expr: str, type_: str) -> str:
    """SQL: a typed value as the text error messages quote (ISO dates and times, UTC; numbers shortest)."""
    if type_ == "timestamp":
        return f"strftime(timezone('UTC', {expr}), '%Y-%m-%dT%H:%M:%S.%fZ')"
    if type_ == "float":
        return float_text(expr)
    return f"CAST({expr} AS VARCHAR)"


def float_text(expr: str) -> str:
    """SQL: the shortest text that reads back as the same float, in the style of a double's text. DuckDB's own
    float-to-text is sometimes a digit longer (2175463.75 where 2175463.8 reads back the same); a double's
    is the shortest, so the fewest significant digits that read back are found first, then written as a double."""
    wide = f"CAST({expr} AS DOUBLE)"
    tries = []
    for digits in range(1, 10):  # 9 significant digits always read back as the same float
        text = f"printf('%.{digits}g', {wide})"
        reads_back = f"TRY_CAST(TRY_CAST({text} AS DOUBLE) AS FLOAT) = {expr}"
        tries.append(f"CASE WHEN {reads_back} THEN CAST(CAST({text} AS DOUBLE) AS VARCHAR) END")
    return f"coalesce({', '.join(tries)})"


def utc_day(expr: str) -> str:
    """SQL: a timestamp's UTC day (a plain cast would take the session's time zone's day)."""
    return f"CAST(timezone('UTC', {expr}) AS DATE)"


def instant_literal(text: str) -> str:
    """SQL: an ISO timestamp (a config's bound) as a UTC instant; no offset means UTC, as for record texts."""
    stamp = datetime.fromisoformat(text)
    stamp = stamp if stamp.tzinfo is None else stamp.astimezone(UTC).replace(tzinfo=None)
    return f"TIMESTAMPTZ '{stamp.isoformat(sep=' ', timespec='microseconds')}+00:00'"


def day_literal(text: str) -> str:
    return f"DATE '{date.fromisoformat(text).isoformat()}'"
