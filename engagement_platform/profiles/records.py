"""The profile CDC record on Kafka and its validation through the composable ingest framework.

One JSON object per message (key: "<tenant>/<primary_id>", so a key's changes stay in order on one
partition, though the processor does not rely on it: the CDC sequence decides):

    {"tenant": "acme", "primary_id": "789", "related_ids": ["101", "103"], "record_type": "person",
     "op": "upsert" | "delete", "cdc_seq": 1042, "cdc_ts": "2026-01-05T10:07:00Z",
     "fields": {"email": "a@b.c", "country": "DE", "updated_at": "2026-01-05T10:06:59Z", ...}}

`fields` may also be a string holding the JSON object (hot stores often ship it that way). Ids may
be JSON numbers; they are kept as their text. Bad records (not JSON, oversized, missing tenant or
id, bad tenant name, unknown op, wrong types, `fields` not a JSON object, `related_ids` not an
array) become error rows in the one quarantine schema, never exceptions.

Promoted columns (top-level keys of `fields`, for pushdown): email, country, updated_at (ISO time).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from engagement_platform.ingest.config import PipelineConfig, load_kafka_pipeline
from engagement_platform.ingest.errors import ERRORS
from engagement_platform.ingest.pipeline import Pipeline
from engagement_platform.ingest.plugins import ColumnValidator
from engagement_platform.ingest.sql_let import hoist
from engagement_platform.ingest.sql_parse import JSON_SPACE
from engagement_platform.ingest.sql_steps import SqlError, SqlStep, col
from engagement_platform.ingest.sql_types import ident, literal, text_to
from engagement_platform.profiles.tables import BUCKET_FORMAT, BUCKET_SECONDS, BUCKET_SPARK_FORMAT

PIPELINE_FILE = Path(__file__).parent / "staging" / "pipeline.yaml"  # the CDC record as the dumper validates it
# Parses any JSON object without knowing its schema (values as their text: cheaper than variants).
FIELDS_MAP = "map<string,string>"
# RFC 8259, as the processor's parser (tenant_merge.loads) reads it; Spark's defaults also take single
# quotes and NaN, which would then stop the processor on a record staging accepted.
STRICT_JSON = {"allowSingleQuotes": "false", "allowNonNumericNumbers": "false"}


def profile_cdc_pipeline(topic: str, max_record_bytes: int | None = None) -> PipelineConfig:
    """The CDC pipeline reading `topic`; `max_record_bytes` None keeps the file's limit."""
    return load_kafka_pipeline(PIPELINE_FILE, topic, max_record_bytes=max_record_bytes or None)


# `fields` and `related_ids` parsed once per record (with_parsed_json), for the shape check and for
# the staging columns: each from_json is a large share of a slice's cost.
FIELDS_OBJECT = "_fields_object"
RELATED_LIST = "_related_list"
PARSED_JSON = (FIELDS_OBJECT, RELATED_LIST)


def with_parsed_json(parsed: DataFrame) -> DataFrame:
    # from_json keeps a repeated key twice in the map and getItem returns the first; rebuilding the map
    # applies spark.sql.mapKeyDedupPolicy=LAST_WIN (spark/session.py), so the promoted columns take the
    # last value, as the processor's JSON fold (tenant_merge.loads) and json.loads do.
    fields = F.from_json("fields", FIELDS_MAP, STRICT_JSON)
    return parsed.withColumns(
        {
            FIELDS_OBJECT: F.map_from_entries(F.map_entries(fields)),
            RELATED_LIST: F.from_json("related_ids", "array<string>", STRICT_JSON),
        }
    )


class JsonShape(ColumnValidator):
    """`fields` must be a JSON object and `related_ids` a JSON array (null is fine for both).
    Reads the parses with_parsed_json added (null where the text is not of that shape)."""

    def errors(self) -> list[Column]:
        fields, related = F.col("fields"), F.col("related_ids")
        return [
            F.when(
                fields.isNotNull() & F.col(FIELDS_OBJECT).isNull(),
                self.err("fields", "invalid_json", "fields is not a JSON object", F.substring(fields, 1, 200)),
            ),
            F.when(
                related.isNotNull() & F.col(RELATED_LIST).isNull(),
                self.err(
                    "related_ids",
                    "invalid_json",
                    "related_ids is not a JSON array of ids",
                    F.substring(related, 1, 200),
                ),
            ),
        ]

    def sql_step(self, columns: dict[str, str]) -> SqlStep:
        """The same checks on the vectorized path: RFC 8259 text of the right shape (the record reader's
        tolerances, NaN and trailing commas, are refused here: the processor's parser refuses them)."""
        fields, related = col(columns, "fields"), col(columns, "related_ids")
        return SqlStep(
            errors=[
                SqlError(
                    f"{fields} IS NOT NULL AND NOT {strict_json(fields, '{')}",
                    "fields",
                    "invalid_json",
                    literal("fields is not a JSON object"),
                    f"left({fields}, 200)",
                ),
                SqlError(
                    f"{related} IS NOT NULL AND NOT {strict_json(related, '[')}",
                    "related_ids",
                    "invalid_json",
                    literal("related_ids is not a JSON array of ids"),
                    f"left({related}, 200)",
                ),
            ]
        )


JSON_STRING = r'"(?:[^"\\]|\\.)*"'
# What the vectorized JSON reader tolerates and RFC 8259 does not, once the strings are taken out:
# NaN / Infinity / Inf in any case, and a comma before a closing bracket.
NOT_STRICT = r"[nN][aA][nN]|[iI][nN][fF]|,[ \t\r\n]*[}\]]"


def strict_json(expr: str, opener: str) -> str:
    """SQL: `expr` is one RFC 8259 JSON value that starts with `opener` ({ or [)."""
    shape = f"starts_with(ltrim({expr}, {JSON_SPACE}), {literal(opener)})"
    # each string becomes a 0: what is left is numbers, literals and punctuation (an empty string would turn
    # ["a","b"] into [,] and look like a trailing comma); only a text where the pattern occurs at all, inside a
    # string or not, pays for that rewrite
    suspect = f"regexp_matches({expr}, {literal(NOT_STRICT)})"
    lax = f"regexp_matches(regexp_replace({expr}, {literal(JSON_STRING)}, '0', 'g'), {literal(NOT_STRICT)})"
    strict = f"(CASE WHEN {suspect} THEN NOT {lax} ELSE true END)"
    return f"(CASE WHEN json_valid({expr}) THEN {shape} AND {strict} ELSE false END)"


def profile_pipeline(config: PipelineConfig) -> Pipeline:
    pipeline = Pipeline.from_config(config)
    # Stream-specific checks join the schema's own validators (no registry entry needed).
    pipeline.validators.append(JsonShape("profile_cdc", JsonShape.Params(), config.target.columns))
    return pipeline


def validated_cdc(config: PipelineConfig, parsed: DataFrame) -> DataFrame:
    """Parsed CDC records -> validated rows with `_errors` and the staging columns."""
    validated = profile_pipeline(config).transform(with_parsed_json(parsed), keep=PARSED_JSON)
    return with_staging_columns(validated)


def with_staging_columns(validated: DataFrame) -> DataFrame:
    """Adds what staging stores beyond the validated record: bucket, ids as an array, promoted columns.

    Evaluated on every row (bad ones give nulls, never errors), so it fuses into the same projection.
    """
    ts = F.col("cdc_ts")
    bucket = F.date_format(
        F.timestamp_seconds(F.floor(F.unix_seconds(ts) / BUCKET_SECONDS) * BUCKET_SECONDS), BUCKET_SPARK_FORMAT
    )
    return validated.withColumns(
        {
            "bucket": bucket,
            # null when the record does not carry it: the processor then keeps the stored neighbours
            "related_ids": F.col(RELATED_LIST),
            **promoted_columns(F.col(FIELDS_OBJECT)),
        }
    ).drop(*PARSED_JSON)


def promoted_columns(fields: Column) -> dict[str, Column]:
    """email, country, updated_at from the parsed `fields` object (a string value as itself, any other
    as its JSON text; null when absent or, for updated_at, not a time)."""
    return {
        "email": fields.getItem("email"),
        "country": fields.getItem("country"),
        "updated_at": fields.getItem("updated_at").try_cast("timestamp"),
    }


PROMOTED = ("email", "country", "updated_at")


def promoted_text(key: str) -> str:
    """SQL: the text of `fields`' key `key` (the last occurrence wins, as in the processor's JSON fold): a string
    value as itself, any other as its JSON text; null when absent. Reads `_keys` and `_values`, the object's
    keys and values in order, repeats included."""
    last = f"len(_keys) + 1 - list_position(list_reverse(_keys), {literal(key)})"
    return f"CASE WHEN list_contains(_keys, {literal(key)}) THEN json_extract_string(_values[{last}], '$') END"


def staging_columns_sql() -> str:
    """The vectorized twin of with_staging_columns, over the plan's result (`rows`): on the records that
    passed (the others get nulls; their `fields` may not be JSON at all)."""
    good = f"len({ERRORS}) = 0"
    promoted = ", ".join(f"{promoted_text(k)} AS {ident('_' + k)}" for k in PROMOTED)
    ctes = [
        f"members AS (SELECT *, CASE WHEN {good} THEN json_keys(fields) END AS _keys, "
        f"CASE WHEN {good} THEN json_extract(fields, '$.*') END AS _values FROM rows)",
        f"promoted AS (SELECT * EXCLUDE (_keys, _values), {promoted} FROM members)",
    ]
    texts = hoist([text_to(ident("_updated_at"), "timestamp")], ident, "__promoted_")
    source = "promoted"
    for k, level in enumerate(texts.levels):
        lets = ", ".join(f"{expr} AS {ident(name)}" for name, expr in level.items())
        ctes.append(f"let{k} AS (SELECT *, {lets} FROM {source})")
        source = f"let{k}"
    bucket_us = BUCKET_SECONDS * 1_000_000
    bucket = f"strftime(make_timestamp(CAST(floor(epoch_us(cdc_ts) / {bucket_us}) * {bucket_us} AS BIGINT)), {literal(BUCKET_FORMAT)})"
    related = f"CASE WHEN {good} AND related_ids IS NOT NULL THEN json_transform(related_ids, '[\"VARCHAR\"]') END"
    hidden = ", ".join(ident(c) for c in (*texts.hidden(), *(f"_{k}" for k in PROMOTED), "related_ids"))
    return (
        "WITH " + ", ".join(ctes) + f" SELECT * EXCLUDE ({hidden}), {bucket} AS bucket, {related} AS related_ids, "
        f"_email AS email, _country AS country, {texts.texts[0]} AS updated_at FROM {source}"
    )


def with_staging_columns_arrow(rows: pa.Table) -> pa.Table:
    """Adds the staging columns to the vectorized plan's result, inside the task (one DuckDB query)."""
    import duckdb

    con = duckdb.connect(config={"threads": 1})
    try:
        con.register("rows", rows)
        return con.execute(STAGING_SQL).fetch_arrow_table()
    finally:
        con.close()


STAGING_SQL = staging_columns_sql()
