"""Parse and validate raw engagement messages in Spark; every bad record gets reasons, never an exception.

One pass: JSON text -> all-string struct (so a wrong type is reported as such, not as a null) ->
typed columns with try_cast -> an `errors` array of (stage, plugin, column, code, message, value).
A record is good when its array is empty. Oversized records are not parsed at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from engagement_platform.engagement.tables import ACTIVITY_TYPES

REQUIRED = ("org_id", "engagement_id", "activity_type", "event_time")
STRING_FIELDS = (
    "org_id", "engagement_id", "activity_type", "lead_id", "contact_id", "account_id", "user_id",
    "cadence_id", "template_id", "subject", "call_outcome", "payload",
)
# field -> (Spark type, human name) for fields that must convert
TYPED_FIELDS = {"event_time": ("timestamp", "timestamp"), "engagement_date": ("date", "date"), "duration_seconds": ("int", "integer")}
RAW_SCHEMA = ", ".join(f"`{f}` string" for f in (*STRING_FIELDS, *TYPED_FIELDS)) + ", `_corrupt_record` string"
PLUGIN = "engagement_record"


@dataclass(frozen=True)
class RecordRules:
    max_record_bytes: int = 64 * 1024
    activity_types: tuple[str, ...] = ACTIVITY_TYPES


def _error(stage: str, column: str | None, code: str, message: Column, value: Column | None = None) -> Column:
    return F.struct(
        F.lit(stage).alias("stage"),
        F.lit(PLUGIN).alias("plugin"),
        F.lit(column).cast("string").alias("column_name"),
        F.lit(code).alias("error_code"),
        message.alias("message"),
        (value if value is not None else F.lit(None)).cast("string").alias("value"),
    )


def parse_and_validate(raw: DataFrame, rules: RecordRules) -> DataFrame:
    """Raw Kafka rows (kafka_partition, kafka_offset, value...) -> typed columns + `errors` array.

    Staged selects so the string cast, the JSON parse and each typed cast run once per row.
    """
    size = F.length(F.col("value"))
    staged = raw.select(
        "kafka_partition", "kafka_offset", "value", size.alias("_size"),
        F.when(size <= rules.max_record_bytes, F.col("value").cast("string")).alias("_text"),
    )
    parsed = staged.select(
        "kafka_partition", "kafka_offset", "value", "_size", "_text",
        F.from_json("_text", RAW_SCHEMA, {"columnNameOfCorruptRecord": "_corrupt_record", "mode": "PERMISSIVE"}).alias("j"),
    )
    typed = parsed.select(
        "kafka_partition", "kafka_offset", "value", "_size", "_text",
        F.col("j._corrupt_record").alias("_corrupt"),
        *[F.col(f"j.{f}").alias(f) for f in STRING_FIELDS],
        *[F.col(f"j.{f}").alias(f"_raw_{f}") for f in TYPED_FIELDS],
        *[F.expr(f"try_cast(j.`{f}` as {t})").alias(f"_typed_{f}") for f, (t, _) in TYPED_FIELDS.items()],
    )

    oversized = F.col("_size") > rules.max_record_bytes
    parsed_ok = F.col("_text").isNotNull() & F.col("_corrupt").isNull()
    checks: list[tuple[Column, Column]] = [
        (F.col("value").isNull(), _error("parse", None, "empty_record", F.lit("record has no value"))),
        (oversized, _error("parse", None, "oversized", F.format_string(f"record is %d bytes, limit {rules.max_record_bytes}", F.col("_size")))),
        # from_json marks anything that is not one JSON object (invalid text, arrays, scalars) as corrupt.
        (F.col("_corrupt").isNotNull(), _error("parse", None, "not_json", F.lit("record is not a JSON object"), F.substring("_text", 1, 200))),
    ]
    for field in REQUIRED:
        source = F.col(f"_raw_{field}") if field in TYPED_FIELDS else F.col(field)
        checks.append((parsed_ok & source.isNull(), _error("validate", field, "missing_field", F.lit(f"required field '{field}' is missing or null"))))
    for field, (_, human) in TYPED_FIELDS.items():
        raw_value = F.col(f"_raw_{field}")
        checks.append(
            (raw_value.isNotNull() & F.col(f"_typed_{field}").isNull(),
             _error("validate", field, "wrong_type", F.format_string(f"field '{field}' is not a valid {human}: %s", raw_value), raw_value))
        )
    activity = F.col("activity_type")
    allowed = ", ".join(rules.activity_types)
    checks.append(
        (activity.isNotNull() & ~activity.isin(*rules.activity_types),
         _error("validate", "activity_type", "unknown_activity_type", F.format_string(f"unknown activity_type '%s' (allowed: {allowed})", activity), activity))
    )
    errors = F.array_compact(F.array(*[F.when(cond, err) for cond, err in checks]))
    return typed.select(
        "kafka_partition",
        "kafka_offset",
        *STRING_FIELDS,
        F.col("_typed_event_time").alias("event_time"),
        F.coalesce(F.col("_typed_engagement_date"), F.to_date("_typed_event_time")).alias("engagement_date"),
        F.col("_typed_duration_seconds").alias("duration_seconds"),
        errors.alias("errors"),
        # Only bad records carry their raw bytes back to the driver.
        F.when(F.size(errors) > 0, F.col("value")).alias("value"),
    )


def mark_duplicates_in_batch(validated: pa.Table) -> tuple[pa.Table, list[int]]:
    """Give later copies of an (org_id, engagement_id) a duplicate_in_batch error; return their rows.

    Among valid rows the first occurrence (lowest partition, offset) wins. Runs on the driver over
    the Arrow result (a hash group-by on two columns) instead of a sort-based window shuffle in Spark.
    The flagged rows come back from Spark without raw bytes: the caller fetches those.
    """
    valid = pc.equal(pc.list_value_length(validated["errors"]), 0)
    keys = pa.table({
        "org_id": validated["org_id"], "engagement_id": validated["engagement_id"],
        "p": validated["kafka_partition"], "o": validated["kafka_offset"], "i": pa.array(range(validated.num_rows), pa.int64()),
    }).filter(valid)
    firsts = (keys.sort_by([("p", "ascending"), ("o", "ascending")])
              .group_by(["org_id", "engagement_id"], use_threads=False).aggregate([("i", "first")]))
    if firsts.num_rows == keys.num_rows:
        return validated, []
    duplicates = sorted(pc.filter(keys["i"], pc.invert(pc.is_in(keys["i"], firsts["i_first"]))).to_pylist())
    errors = validated["errors"].to_pylist()
    for i in duplicates:
        eid = validated["engagement_id"][i].as_py()
        errors[i] = [{"stage": "validate", "plugin": PLUGIN, "column_name": "engagement_id", "error_code": "duplicate_in_batch",
                      "message": f"engagement_id '{eid}' already appears earlier in this batch", "value": eid}]
    column = validated.schema.get_field_index("errors")
    return validated.set_column(column, "errors", pa.array(errors, validated.schema.field("errors").type)), duplicates
