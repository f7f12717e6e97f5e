"""Parse and validate raw engagement messages in Spark; every bad record gets reasons, never an exception.

One pass: JSON text -> all-string struct (so a wrong type is reported as such, not as a null) ->
typed columns with try_cast -> an `errors` array of (stage, plugin, column, code, message, value).
A record is good when its array is empty. Oversized records are not parsed at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

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
    reject_duplicates_in_batch: bool = True


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
    """Raw Kafka rows (kafka_partition, kafka_offset, value...) -> typed columns + `errors` array."""
    text = F.col("value").cast("string")
    size = F.length(F.col("value"))
    oversized = size > rules.max_record_bytes
    parsed = raw.select(
        "kafka_partition",
        "kafka_offset",
        "value",
        size.alias("_size"),
        F.when(~oversized, F.from_json(text, RAW_SCHEMA, {"columnNameOfCorruptRecord": "_corrupt_record", "mode": "PERMISSIVE"})).alias("j"),
        F.ltrim(F.substring(text, 1, 16)).startswith("{").alias("_is_object"),
    )
    typed = {f: F.expr(f"try_cast(j.`{f}` as {t})") for f, (t, _) in TYPED_FIELDS.items()}

    checks: list[tuple[Column, Column]] = [
        (F.col("value").isNull(), _error("parse", None, "empty_record", F.lit("record has no value"))),
        (oversized, _error("parse", None, "oversized", F.format_string(f"record is %d bytes, limit {rules.max_record_bytes}", F.col("_size")))),
        (~oversized & F.col("j._corrupt_record").isNotNull(), _error("parse", None, "not_json", F.lit("record is not valid JSON"), F.substring(text, 1, 200))),
        (~oversized & F.col("j._corrupt_record").isNull() & ~F.col("_is_object"), _error("parse", None, "not_json_object", F.lit("JSON value is not an object"), F.substring(text, 1, 200))),
    ]
    parsed_ok = ~oversized & F.col("j._corrupt_record").isNull() & F.col("_is_object")
    for field in REQUIRED:
        checks.append((parsed_ok & F.col(f"j.{field}").isNull(), _error("validate", field, "missing_field", F.lit(f"required field '{field}' is missing or null"))))
    for field, (_, human) in TYPED_FIELDS.items():
        raw_value = F.col(f"j.{field}")
        checks.append(
            (parsed_ok & raw_value.isNotNull() & typed[field].isNull(),
             _error("validate", field, "wrong_type", F.format_string(f"field '{field}' is not a valid {human}: %s", raw_value), raw_value))
        )
    activity = F.col("j.activity_type")
    allowed = ", ".join(rules.activity_types)
    checks.append(
        (parsed_ok & activity.isNotNull() & ~activity.isin(*rules.activity_types),
         _error("validate", "activity_type", "unknown_activity_type", F.format_string(f"unknown activity_type '%s' (allowed: {allowed})", activity), activity))
    )

    errors = F.filter(F.array(*[F.when(cond, err) for cond, err in checks]), lambda e: e.isNotNull())
    out = parsed.select(
        "kafka_partition",
        "kafka_offset",
        *[F.col(f"j.{f}").alias(f) for f in STRING_FIELDS],
        typed["event_time"].alias("event_time"),
        F.coalesce(typed["engagement_date"], F.to_date(typed["event_time"])).alias("engagement_date"),
        typed["duration_seconds"].alias("duration_seconds"),
        errors.alias("errors"),
        "value",
    )
    if rules.reject_duplicates_in_batch:
        # The first occurrence (lowest partition/offset) wins; later copies are reported, not dropped.
        # Invalid rows sort last so they never make a valid later copy look like a duplicate.
        has_errors = F.size("errors") > 0
        first = Window.partitionBy("org_id", "engagement_id").orderBy(has_errors, "kafka_partition", "kafka_offset")
        rank = F.when(~has_errors, F.row_number().over(first))
        dup = _error("validate", "engagement_id", "duplicate_in_batch", F.format_string("engagement_id '%s' already appears earlier in this batch", F.col("engagement_id")), F.col("engagement_id"))
        out = out.withColumn("errors", F.when(rank > 1, F.array_append("errors", dup)).otherwise(F.col("errors")))
    # Only bad records carry their raw bytes back to the driver.
    return out.withColumn("value", F.when(F.size("errors") > 0, F.col("value")))
