"""A pipeline compiled to one DuckDB query that runs inside a Spark task on the Arrow batch it holds.

parse (JSON into the source columns) -> each converter -> conform -> every validator at once, as a chain of
projections; a row's `_errors` list gets a stage's errors only while it is still clean, exactly as the Spark
plan of pipeline.py does. The result has the same columns as `Pipeline.transform` (carried columns, typed
target columns, `_errors`, and raw bytes plus input JSON on rejected rows), so the code after it does not
care which path ran. The rules (JSON, text to types, messages) are written down in
docs/reference/record-format.md and checked against a slow reference (engagement_platform_tests/ingest).

`compile_plan` raises NoSqlForm when a stage has no vectorized form (a DataFrame-contract plugin, a decimal
column, a CSV option other than the separator and quote): the pipeline then runs on Spark, and `paths()` says which one each stage took.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.ingest.builtin import Conform
from engagement_platform.ingest.config import SourceSpec
from engagement_platform.ingest.errors import ERROR_FIELDS, ERRORS, PARSE, RAW, ROW_ID, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import Pipeline, PipelineBuildError
from engagement_platform.ingest.plugins import NoParams
from engagement_platform.ingest.sources import INPUT, PARSER, expected_record
from engagement_platform.ingest.sql_let import hoist
from engagement_platform.ingest.sql_parse import SIZE, TEXT, WELL_FORMED, parse_ctes, source_columns
from engagement_platform.ingest.sql_steps import SqlError, SqlStep, sql_step
from engagement_platform.ingest.sql_types import SQL_TYPES, NoSqlForm, ident, literal
from engagement_platform.ingest.tables import SPARK_TO_ARROW

ERROR_SQL_TYPE = "STRUCT(" + ", ".join(f"{f} VARCHAR" for f in ERROR_FIELDS) + ")"
NO_ERRORS = f"CAST([] AS {ERROR_SQL_TYPE}[])"
ERROR_ARROW_TYPE = pa.list_(pa.struct([(f, pa.string()) for f in ERROR_FIELDS]))


@dataclass(frozen=True)
class Check:
    stage: str
    plugin: str
    error: SqlError

    def struct(self) -> str:
        fields = {
            "stage": literal(self.stage),
            "plugin": literal(self.plugin),
            "column_name": literal(self.error.column) if self.error.column is not None else "NULL",
            "error_code": literal(self.error.code),
            "message": self.error.message,
            "value": self.error.value or "NULL",
        }
        return "{" + ", ".join(f"{literal(k)}: CAST({v} AS VARCHAR)" for k, v in fields.items()) + "}"

    def when(self) -> str:
        return f"coalesce({self.error.when}, false)"


def gather(checks: list[Check], prior: str | None = ERRORS) -> str:
    """SQL: the `prior` errors, or when there are none, the checks' errors (conditions evaluated once per
    clean row, the error structs built only on rows that have one)."""
    if not checks:
        return prior or NO_ERRORS
    any_error = " OR ".join(c.when() for c in checks)
    items = ", ".join(f"CASE WHEN {c.when()} THEN {c.struct()} END" for c in checks)
    found = f"list_filter([{items}], x -> x IS NOT NULL)"
    if prior is None:
        return f"CASE WHEN {any_error} THEN {found} ELSE {NO_ERRORS} END"
    return f"CASE WHEN len({prior}) > 0 THEN {prior} WHEN {any_error} THEN {found} ELSE {prior} END"


@dataclass(frozen=True)
class VectorPlan:
    pipeline: str
    sql: str
    schema: pa.Schema
    max_record_bytes: int
    stage_paths: tuple[tuple[str, str], ...]

    def paths(self) -> dict[str, str]:
        return dict(self.stage_paths)

    def run(self, raw: pa.Table) -> pa.Table:
        """raw: _row_id, _source_partition, _source_offset, _raw (binary) -> the pipeline's result."""
        import duckdb

        con = duckdb.connect(config={"threads": 1})
        try:
            con.execute("SET TimeZone = 'UTC'")  # the SQL does not depend on it; a guard for SQL to come
        except duckdb.Error:
            pass  # no ICU extension: DuckDB's time zone is UTC anyway
        try:
            con.register("src", with_text(raw))
            return con.execute(self.sql).fetch_arrow_table().cast(self.schema)
        finally:
            con.close()


def with_text(raw: pa.Table) -> pa.Table:
    """`raw` plus the record's text (null when not UTF-8) and its size in bytes. The plan parses only the
    texts within the size limit: nothing here copies the values."""
    text = pa.chunked_array([_as_text(chunk) for chunk in raw[RAW].chunks], pa.string())
    size = pc.cast(pc.binary_length(raw[RAW]), pa.int64())
    return raw.append_column(TEXT, text).append_column(SIZE, size)


def _as_text(values: pa.Array) -> pa.Array:
    try:
        return pc.cast(values, pa.string())
    except pa.ArrowInvalid:  # rare: find the records that are not UTF-8, one by one
        return pa.array([_utf8(v) for v in values.to_pylist()], pa.string())


def _utf8(value: bytes | None) -> str | None:
    try:
        return value.decode("utf-8") if value is not None else None
    except UnicodeDecodeError:
        return None


def parse_checks(source: SourceSpec) -> list[Check]:
    limit = source.max_record_bytes
    return [
        Check(PARSE, PARSER, SqlError(f"{RAW} IS NULL OR {SIZE} = 0", None, "empty_record", literal("record has no content"))),
        Check(PARSE, PARSER, SqlError(
            f"{SIZE} > {limit}", None, "oversized", f"'record is ' || {SIZE} || ' bytes, limit {limit}'"
        )),
        Check(PARSE, PARSER, SqlError(
            f"{SIZE} > 0 AND {SIZE} <= {limit} AND NOT {WELL_FORMED}", None, "malformed_record",
            literal(f"record is not {expected_record(source)}"), f"left({TEXT}, 200)",
        )),
    ]  # fmt: skip


def compile_plan(pipeline: Pipeline) -> VectorPlan:
    """The pipeline as one DuckDB query; NoSqlForm when a stage has no vectorized form."""
    config = pipeline.config
    source = config.source
    typed = [c for c, t in source.columns.items() if t != "string"]
    if typed:
        raise NoSqlForm(f"source columns {typed} are not text")
    columns = {c: "string" for c in source.columns}
    carried = f"{ROW_ID}, {SOURCE_PARTITION}, {SOURCE_OFFSET}, {RAW}"
    ctes = [
        *parse_ctes(source, carried),
        f"s0 AS (SELECT {carried}, {INPUT}, {source_columns(source)}, "
        f"{gather(parse_checks(source), prior=None)} AS {ERRORS} FROM parsed)",
    ]
    paths = [(f"parse:{source.format}", "duckdb")]
    steps = ["s0"]

    def add(step: SqlStep, checks: list[Check]) -> None:
        n = len(steps)
        outputs = {name: expr for name, (expr, _) in step.columns.items()}
        errors = [c.error for c in checks]
        texts = [*outputs.values(), *(t or "" for e in errors for t in (e.when, e.message, e.value))]
        hoisted = hoist(texts, ident, f"__once_{n}_")
        source = steps[-1]
        for k, level in enumerate(hoisted.levels):  # each level reads the columns of the ones before it
            lets = ", ".join(f"{expr} AS {ident(name)}" for name, expr in level.items())
            ctes.append(f"s{n}_once{k} AS (SELECT *, {lets} FROM {source})")
            source = f"s{n}_once{k}"
        rewritten = iter(hoisted.texts)
        outputs = {name: next(rewritten) for name in outputs}
        checks = [
            Check(c.stage, c.plugin, SqlError(next(rewritten), c.error.column, c.error.code, next(rewritten),
                                              next(rewritten) or None))
            for c in checks
        ]  # fmt: skip
        dropped = [c for c in (*outputs, *step.drops) if c in columns]
        exclude = ", ".join(ident(c) for c in (*dropped, *hoisted.hidden(), ERRORS))
        selected = "".join(f", {expr} AS {ident(name)}" for name, expr in outputs.items())
        ctes.append(f"s{n} AS (SELECT * EXCLUDE ({exclude}){selected}, {gather(checks)} AS {ERRORS} FROM {source})")
        steps.append(f"s{n}")
        for c in step.drops:
            columns.pop(c, None)
        columns.update({name: type_ for name, (_, type_) in step.columns.items()})

    for conv in pipeline.converters:
        step = sql_step(conv, dict(columns))
        add(step, [Check(conv.stage, conv.name, e) for e in step.errors])
        paths.append((f"convert:{conv.name}", "duckdb"))
    target = config.target.columns
    missing = [c for c in target if c not in columns]
    if missing:
        raise PipelineBuildError(
            f"pipeline {config.name}: target columns {missing} come from no source column and no converter "
            f"(columns after the converters: {list(columns)})"
        )
    conform = sql_step(Conform("conform", NoParams(), target, {}), dict(columns))
    add(conform, [Check("convert", "conform", e) for e in conform.errors])
    checks = []
    for validator in pipeline.validators:
        step = sql_step(validator, dict(columns))
        checks += [Check(validator.stage, validator.name, e) for e in step.errors]
        paths.append((f"validate:{validator.name}", "duckdb"))
    add(SqlStep(), checks)
    last = steps[-1]
    for name, spec in target.items():
        if spec.type not in SQL_TYPES:
            raise NoSqlForm(f"target type {spec.type} of '{name}' has no vectorized form")
    bad = f"len({ERRORS}) > 0"
    final = (
        f"SELECT {ROW_ID}, {SOURCE_PARTITION}, {SOURCE_OFFSET}, "
        + "".join(f"{ident(c)}, " for c in target)
        + f"{ERRORS}, CASE WHEN {bad} THEN {RAW} END AS {RAW}, CASE WHEN {bad} THEN to_json({INPUT}) END AS {INPUT} "
        f"FROM {last}"
    )
    schema = pa.schema(
        [
            (ROW_ID, pa.int64()),
            (SOURCE_PARTITION, pa.int32()),
            (SOURCE_OFFSET, pa.int64()),
            *[(c, SPARK_TO_ARROW[spec.type]) for c, spec in target.items()],
            (ERRORS, ERROR_ARROW_TYPE),
            (RAW, pa.binary()),
            (INPUT, pa.string()),
        ]
    )
    sql = "WITH " + ",\n".join(ctes) + "\n" + final
    return VectorPlan(config.name, sql, schema, source.max_record_bytes, tuple(paths))
