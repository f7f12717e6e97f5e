"""Text -> typed value, as DuckDB SQL: the conversion rules of the vectorized record path (docs/reference/
record-format.md). Each rule first checks the text's shape with a full-match regex, then casts: DuckDB's
casts alone accept more than the rules say ('0x10' as an int, '24:00' as a time), and the shape check is
what makes the path equal to its reference (engagement_platform_tests/ingest/reference.py)."""

from __future__ import annotations

import re

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
DATE_TEXT = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
TIME_TEXT = r"([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?"
OFFSET_TEXT = r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
TIMESTAMP_TEXT = rf" *{DATE_TEXT}([T ]{TIME_TEXT}{OFFSET_TEXT}?)? *"
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
        tried = []
        for pattern in formats:
            fmt, shape = translate_pattern(pattern)
            tried.append(f"CASE WHEN {matches(expr, shape)} THEN try_strptime({expr}, {literal(fmt)}) END")
        stamp = f"coalesce({', '.join(tried)})"
        return f"CAST({stamp} AS DATE)" if type_ == "date" else f"CAST({stamp} AS TIMESTAMPTZ)"
    if type_ in ("date", "timestamp"):
        year_zero = f"starts_with({trimmed}, '0000')"  # no year 0 in the proleptic calendar of the reference
        valid = f"{matches(expr, TIMESTAMP_TEXT)} AND NOT {year_zero}"
        if type_ == "date":  # the date as written, whatever time follows it
            return f"CASE WHEN {valid} THEN TRY_CAST(left({trimmed}, 10) AS DATE) END"
        return f"CASE WHEN {valid} THEN TRY_CAST({trimmed} AS TIMESTAMPTZ) END"
    raise NoSqlForm(f"type {type_} has no vectorized conversion")


def convert(expr: str, have: str, want: str, formats: list[str] | None = None) -> str:
    """SQL: a column of type `have` as `want` (text by the rules above; a timestamp to its UTC day)."""
    if have == want or (have in INTEGERS and want in INTEGERS and INTEGERS[have] == INTEGERS[want]):
        return expr
    if have == "string":
        return text_to(expr, want, formats)
    if have == "timestamp" and want == "date":
        return f"CAST({expr} AS DATE)"
    raise NoSqlForm(f"{have} -> {want} has no vectorized conversion")


def as_text(expr: str, type_: str) -> str:
    """SQL: a typed value as the text error messages quote (ISO dates and times, UTC)."""
    if type_ == "timestamp":
        return f"strftime({expr}, '%Y-%m-%dT%H:%M:%S.%fZ')"
    return f"CAST({expr} AS VARCHAR)"
