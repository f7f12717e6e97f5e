"""The vectorized form of a plugin: what it adds to the DuckDB plan (ingest/vector_plan.py).

A plugin declares one by defining `sql_step(columns)`, where `columns` maps each column the step sees to its
type (string, int, date, ...), and returning a SqlStep: output columns as SQL expressions with their types,
the input columns it drops, and its errors as (SQL condition, column, code, message expression, value
expression). The built-in plugins' forms live here; a plugin without one keeps its pipeline on Spark.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from engagement_platform.ingest import builtin
from engagement_platform.ingest.plugins import Plugin
from engagement_platform.ingest.sql_let import once
from engagement_platform.ingest.sql_types import (
    SQL_TYPES,
    NoSqlForm,
    as_text,
    convert,
    day_literal,
    ident,
    instant_literal,
    literal,
    utc_day,
)


@dataclass(frozen=True)
class SqlError:
    when: str  # SQL condition over the step's input columns: this row has the error
    column: str | None
    code: str
    message: str  # SQL expression
    value: str | None = None  # SQL expression (cast to text)


@dataclass(frozen=True)
class SqlStep:
    columns: dict[str, tuple[str, str]] = field(default_factory=dict)  # output -> (SQL, type)
    errors: list[SqlError] = field(default_factory=list)
    drops: tuple[str, ...] = ()


def quoted(parts: list[str]) -> str:
    """SQL: the concatenation of literal text and expressions (a part starting with '$' is an expression)."""
    return " || ".join(p[1:] if p.startswith("$") else literal(p) for p in parts)


def col(columns: dict[str, str], name: str) -> str:
    if name not in columns:
        raise NoSqlForm(f"column '{name}' is not there when the step runs")
    if "." in name:
        raise NoSqlForm(f"nested column '{name}' has no vectorized form")
    return ident(name)


def _hint(formats: list[str] | None) -> str:
    return f" (formats: {', '.join(formats)})" if formats else ""


def conversion_error(columns: dict[str, str], name: str, type_: str, formats: list[str] | None = None) -> SqlError:
    value = col(columns, name)
    converted = convert(value, columns[name], type_, formats)
    return SqlError(
        f"{value} IS NOT NULL AND ({converted}) IS NULL",
        name,
        "wrong_type",
        quoted(["'", f"${as_text(value, columns[name])}", f"' is not a valid {type_}{_hint(formats)}"]),
        as_text(value, columns[name]),
    )


def rename(p: builtin.Rename, columns: dict[str, str]) -> SqlStep:
    return SqlStep({p.params.to: (col(columns, p.params.from_), columns[p.params.from_])}, drops=(p.params.from_,))


def concat(p: builtin.Concat, columns: dict[str, str]) -> SqlStep:
    parts = [col(columns, c) for c in p.params.columns]
    errors = []
    if p.params.required:
        message = f"none of {', '.join(p.params.columns)} has a value"
        errors.append(SqlError(f"coalesce({', '.join(parts)}) IS NULL", p.params.to, "missing_value", literal(message)))
    return SqlStep({p.params.to: (f"concat_ws({literal(p.params.separator)}, {', '.join(parts)})", "string")}, errors)


def split(p: builtin.Split, columns: dict[str, str]) -> SqlStep:
    """Like Spark's split with a limit: at most len(into) parts, the rest joined into the last."""
    if not p.params.separator:
        raise NoSqlForm("an empty separator has no vectorized form")
    value, sep, n = col(columns, p.params.column), literal(p.params.separator), len(p.params.into)
    parts = once(f"string_split(trim({value}, ' '), {sep})")  # read by every output and the check
    last = f"array_to_string(list_slice({parts}, {n}, len({parts})), {sep})"
    outputs = {  # a missing part is null, not an empty string
        name: (f"CASE WHEN len({parts}) > {i} THEN {last if i == n - 1 else f'{parts}[{i + 1}]'} END", "string")
        for i, name in enumerate(p.params.into)
    }
    need = p.params.min_parts or n
    shown = f"coalesce({value}, 'null')"  # a missing value is quoted as the Spark path's message quotes it
    message = quoted(["'", f"${shown}", f"' does not split into {need} parts on '{p.params.separator}'"])
    error = SqlError(f"{value} IS NULL OR len({parts}) < {need}", p.params.column, "split_mismatch", message, value)
    return SqlStep(outputs, [error])


def cast(p: builtin.Cast, columns: dict[str, str]) -> SqlStep:
    name, type_ = p.params.column, p.params.type
    value = col(columns, name)
    converted = convert(value, columns[name], type_, p.params.formats)
    if p.params.default_from:
        fallbacks = [default_as(columns, c, type_) for c in p.params.default_from]
        converted = f"CASE WHEN {value} IS NULL THEN coalesce({', '.join(fallbacks)}) ELSE {converted} END"
    to = p.params.to or name
    drops = (name,) if p.params.to and p.params.to != name else ()
    return SqlStep({to: (converted, type_)}, [conversion_error(columns, name, type_, p.params.formats)], drops)


def default_as(columns: dict[str, str], name: str, type_: str) -> str:
    """A fallback column as `type_`: a date from text goes through the timestamp rule to its UTC day."""
    if type_ == "date" and columns.get(name) == "string":
        return utc_day(convert(col(columns, name), "string", "timestamp"))
    return convert(col(columns, name), columns[name], type_)


def map_values(p: builtin.MapValues, columns: dict[str, str]) -> SqlStep:
    value = col(columns, p.params.column)
    key = value if p.params.case_sensitive else f"lower({value})"
    table: dict[str, str] = {}
    for k, v in p.params.mapping.items():
        table[k if p.params.case_sensitive else k.lower()] = v
    cases = " ".join(f"WHEN {literal(k)} THEN {literal(v)}" for k, v in table.items())
    default = literal(p.params.default) if p.params.default is not None else "NULL"
    mapped = f"CASE {key} {cases} ELSE {default} END"
    errors = []
    if p.params.default is None:
        known = ", ".join(p.params.mapping)
        message = quoted(["'", f"${value}", f"' has no mapping (known: {known})"])
        errors.append(
            SqlError(f"{value} IS NOT NULL AND ({mapped}) IS NULL", p.params.column, "unmapped_value", message, value)
        )
    return SqlStep({p.params.to or p.params.column: (mapped, "string")}, errors)


def coalesce(p: builtin.Coalesce, columns: dict[str, str]) -> SqlStep:
    names = (p.params.column, *p.params.sources)
    type_ = p.params.type or columns.get(p.params.column, "string")
    values = [convert(col(columns, c), columns[c], type_) for c in names]
    errors = []
    if p.params.type:
        before_missing: list[str] = []
        for name in names:
            error = conversion_error(columns, name, type_)
            when = " AND ".join([*before_missing, error.when])
            errors.append(SqlError(when, name, error.code, error.message, error.value))
            before_missing.append(f"{col(columns, name)} IS NULL")
    return SqlStep({p.params.column: (f"coalesce({', '.join(values)})", type_)}, errors)


def conform(p: builtin.Conform, columns: dict[str, str]) -> SqlStep:
    outputs, errors = {}, []
    for name, spec in p.target.items():
        have = columns.get(name)
        if have is None or have == spec.type:
            continue
        outputs[name] = (convert(col(columns, name), have, spec.type, spec.formats), spec.type)
        errors.append(conversion_error(columns, name, spec.type, spec.formats))
    return SqlStep(outputs, errors)


def required(p: builtin.Required, columns: dict[str, str]) -> SqlStep:
    errors = []
    for name in p.params.columns:
        value = col(columns, name)
        blank = not p.params.allow_blank and columns[name] == "string"
        missing = f"{value} IS NULL OR trim({value}, ' ') = ''" if blank else f"{value} IS NULL"
        errors.append(
            SqlError(missing, name, "missing_required", literal(f"required field '{name}' is missing or empty"))
        )
    return SqlStep(errors=errors)


def enum(p: builtin.Enum, columns: dict[str, str]) -> SqlStep:
    value = col(columns, p.params.column)
    values = ", ".join(literal(v) for v in p.params.values)
    message = quoted(["'", f"${value}", f"' is not one of {', '.join(p.params.values)}"])
    return SqlStep(errors=[SqlError(f"{value} NOT IN ({values})", p.params.column, "not_in_enum", message, value)])


def range_(p: builtin.Range, columns: dict[str, str]) -> SqlStep:
    name = p.params.column
    value, type_ = col(columns, name), columns.get(name, "string")
    if type_ not in ("int", "integer", "short", "long", "bigint", "double", "float", "date", "timestamp"):
        raise NoSqlForm(f"range over a {type_} column has no vectorized form")
    outside = [
        f"{value} {op} {bound_literal(bound, type_)}"
        for bound, op in ((p.params.min, "<"), (p.params.max, ">"))
        if bound is not None
    ]
    shown = f"[{builtin.shown_bound(p.params.min)}, {builtin.shown_bound(p.params.max)}]"
    text = as_text(value, type_)
    message = quoted([f"${text}", f" is outside {shown}"])
    return SqlStep(errors=[SqlError(" OR ".join(outside), name, "out_of_range", message, text)])


def bound_literal(bound: float | str, type_: str) -> str:
    """SQL: a range bound as a value of the column's type (a timestamp bound without an offset is UTC)."""
    if isinstance(bound, float):
        return f"CAST({literal(repr(bound))} AS DOUBLE)"
    if type_ == "timestamp":
        return instant_literal(bound)
    if type_ == "date":
        return day_literal(bound)
    return f"CAST({literal(bound)} AS {SQL_TYPES[type_]})"


@cache
def re2_problem(pattern: str) -> str | None:
    """Why DuckDB's RE2 refuses a pattern Python's re accepted (a lookahead, a backreference), or None. The
    query would fail on its first row; the pipeline runs on Spark instead."""
    import duckdb

    con = duckdb.connect()
    try:
        con.execute("SELECT regexp_matches('', ?)", [pattern])
        return None
    except duckdb.Error as exc:
        return str(exc)
    finally:
        con.close()


def regex(p: builtin.Regex, columns: dict[str, str]) -> SqlStep:
    problem = re2_problem(p.params.pattern)
    if problem:
        raise NoSqlForm(f"pattern '{p.params.pattern}' is not RE2 syntax: {problem}")
    value = col(columns, p.params.column)
    message = quoted(["'", f"${value}", f"' does not match {p.params.pattern}"])
    when = f"NOT regexp_matches({value}, {literal(p.params.pattern)})"
    return SqlStep(errors=[SqlError(when, p.params.column, "pattern_mismatch", message, value)])


BUILTIN_FORMS: dict[type, Callable[..., SqlStep]] = {
    builtin.Rename: rename,
    builtin.Concat: concat,
    builtin.Split: split,
    builtin.Cast: cast,
    builtin.MapValues: map_values,
    builtin.Coalesce: coalesce,
    builtin.Conform: conform,
    builtin.Required: required,
    builtin.Enum: enum,
    builtin.Range: range_,
    builtin.Regex: regex,
}


def sql_step(plugin: Plugin, columns: dict[str, str]) -> SqlStep:
    """The plugin's vectorized form for the columns it sees; NoSqlForm when it has none."""
    own = getattr(plugin, "sql_step", None)
    if own is not None:
        return own(columns)
    form = BUILTIN_FORMS.get(type(plugin))
    if form is None:
        raise NoSqlForm(f"plugin '{plugin.name}' ({type(plugin).__name__}) declares no vectorized form")
    return form(plugin, columns)
