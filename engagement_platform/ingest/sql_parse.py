"""The parse stage of the vectorized record path as DuckDB SQL: a record's text -> its source columns.

Each form turns the plan's `src` (the carried columns, `_text`, `_size`) into `parsed`: the same columns, plus
`_well_formed` (the record parsed) and `_input` (a struct of the source columns, text). The rules are those of
docs/reference/record-format.md: one JSON object per record, or one CSV line per record (RFC 4180 quoting).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from engagement_platform.ingest.config import SourceSpec
from engagement_platform.ingest.sources import INPUT
from engagement_platform.ingest.sql_types import NoSqlForm, ident, literal

TEXT, SIZE, WELL_FORMED = "_text", "_size", "_well_formed"
JSON_FORMATS = ("kafka", "jsonl", "json")
JSON_SPACE = "' ' || chr(9) || chr(10) || chr(13)"  # the whitespace RFC 8259 allows around a value
CSV_OPTIONS = {"header", "sep", "delimiter", "quote"}  # the ones the vectorized CSV parse honours
REGEX_SPECIAL = set("\\^$.|?*+()[]{}-/")


@dataclass(frozen=True)
class CsvDialect:
    sep: str
    quote: str

    @classmethod
    def of(cls, source: SourceSpec) -> CsvDialect:
        other = sorted(set(source.options) - CSV_OPTIONS)
        if other:
            raise NoSqlForm(f"CSV options {other} have no vectorized form")
        sep = str(source.options.get("sep", source.options.get("delimiter", ",")))
        quote = str(source.options.get("quote", '"'))
        if len(sep) != 1 or len(quote) != 1 or sep == quote or "\n" in (sep, quote):
            raise NoSqlForm(f"CSV separator {sep!r} and quote {quote!r} are not two distinct characters")
        return cls(sep, quote)

    def line_pattern(self, fields: int) -> str:
        """A whole line of exactly `fields` fields, each captured: quoted ("" is one quote inside) or plain."""
        sep, quote = _regex_char(self.sep), _regex_char(self.quote)
        field = f"({quote}(?:[^{quote}]|{quote}{quote})*{quote}|[^{sep}{quote}]*)"
        return "^" + sep.join([field] * fields) + "$"


def _regex_char(char: str) -> str:
    return "\\" + char if char in REGEX_SPECIAL else char


def parse_ctes(source: SourceSpec, carried: str) -> list[str]:
    """CTEs from `src` to `parsed`; only texts within the size limit are parsed (an oversized record never is)."""
    fits = f"{SIZE} > 0 AND {SIZE} <= {source.max_record_bytes} AND {TEXT} IS NOT NULL"
    if source.format in JSON_FORMATS:
        return json_ctes(source, carried, fits)
    if source.format == "csv":
        return csv_ctes(source, carried, fits)
    raise NoSqlForm(f"a {source.format} source has no vectorized parse")


def json_ctes(source: SourceSpec, carried: str, fits: str) -> list[str]:
    structure = literal(json.dumps({c: "VARCHAR" for c in source.columns}))
    # a valid JSON text is an object exactly when it starts with '{' (cheaper than json_type, a second parse)
    # nested CASEs: DuckDB evaluates both sides of an AND, and a record too large must never be parsed
    is_object = f"starts_with(ltrim({TEXT}, {JSON_SPACE}), '{{')"
    test = f"CASE WHEN {fits} THEN (CASE WHEN json_valid({TEXT}) THEN {is_object} ELSE false END) ELSE false END"
    return [
        f"checked AS (SELECT *, {test} AS {WELL_FORMED} FROM src)",
        f"parsed AS (SELECT {carried}, {TEXT}, {SIZE}, {WELL_FORMED}, "
        f"CASE WHEN {WELL_FORMED} THEN json_transform({TEXT}, {structure}) END AS {INPUT} FROM checked)",
    ]


def csv_ctes(source: SourceSpec, carried: str, fits: str) -> list[str]:
    """A line without a quote character is split on the separator (most lines: no regex); a line with one
    is matched field by field against the dialect's line pattern. An empty plain field is null; a quoted one
    is its text, `""` inside standing for one quote."""
    dialect = CsvDialect.of(source)
    names = list(source.columns)
    sep, quote = literal(dialect.sep), literal(dialect.quote)
    pattern = literal(dialect.line_pattern(len(names)))
    groups = "[" + ", ".join(literal(f"f{i}") for i in range(len(names))) + "]"
    plain = ", ".join(f"{literal(c)}: nullif(_parts[{i + 1}], '')" for i, c in enumerate(names))
    quoted = ", ".join(f"{literal(c)}: {_unquoted(f'_fields.f{i}', dialect)}" for i, c in enumerate(names))
    return [
        f"checked AS (SELECT *, CASE WHEN {fits} THEN contains({TEXT}, {quote}) END AS _quoted FROM src)",
        f"cut AS (SELECT *, CASE WHEN NOT _quoted THEN string_split({TEXT}, {sep}) END AS _parts, "
        f"CASE WHEN _quoted THEN (CASE WHEN regexp_full_match({TEXT}, {pattern}) "
        f"THEN regexp_extract({TEXT}, {pattern}, {groups}) END) END AS _fields FROM checked)",
        f"parsed AS (SELECT {carried}, {TEXT}, {SIZE}, "
        f"coalesce(len(_parts) = {len(names)}, _fields IS NOT NULL) AS {WELL_FORMED}, "
        f"CASE WHEN len(_parts) = {len(names)} THEN {{{plain}}} WHEN _fields IS NOT NULL THEN {{{quoted}}} END "
        f"AS {INPUT} FROM cut)",
    ]


def _unquoted(field: str, dialect: CsvDialect) -> str:
    quote = literal(dialect.quote)
    inner = f"replace({field}[2:-2], {literal(dialect.quote * 2)}, {quote})"
    return f"CASE WHEN starts_with({field}, {quote}) THEN {inner} ELSE nullif({field}, '') END"


def source_columns(source: SourceSpec) -> str:
    """The parsed struct's fields as the source columns (a select list)."""
    return ", ".join(f"{INPUT}.{ident(c)} AS {ident(c)}" for c in source.columns)
