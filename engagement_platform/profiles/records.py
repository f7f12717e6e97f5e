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

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from engagement_platform.ingest.config import PipelineConfig, load_kafka_pipeline
from engagement_platform.ingest.pipeline import Pipeline
from engagement_platform.ingest.plugins import ColumnValidator
from engagement_platform.profiles.tables import BUCKET_SECONDS, BUCKET_SPARK_FORMAT

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
