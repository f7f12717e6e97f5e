"""The Delta tables a pipeline writes, from its config: the typed target table and its quarantine (no
Spark, no Dagster). Framework-level so that erasure in any lake can find the tables a pipeline that names
people wrote (lake/row_erasure.py, ingest/erasure.py)."""

from __future__ import annotations

import pyarrow as pa

from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.lake.delta import TableSpec
from engagement_platform.lake.quarantine import QUARANTINE_SCHEMA
from engagement_platform.lake.schema_evolution import REQUIRED_KEY

SPARK_TO_ARROW = {
    "string": pa.string(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "long": pa.int64(),
    "bigint": pa.int64(),
    "double": pa.float64(),
    "float": pa.float32(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


def _arrow_type(type_: str) -> pa.DataType:
    if type_.startswith("decimal"):
        precision, scale = (int(x) for x in type_[type_.index("(") + 1 : -1].split(","))
        return pa.decimal128(precision, scale)
    return SPARK_TO_ARROW[type_]


def target_spec(config: PipelineConfig) -> TableSpec:
    # Each config column records in the table whether it is required: a later config may drop an optional
    # column, never a required one (lake/schema_evolution.py).
    schema = pa.schema(
        [
            pa.field(name, _arrow_type(spec.type), metadata={REQUIRED_KEY: "true" if spec.required else "false"})
            for name, spec in config.target.columns.items()
        ]
        + [("batch_id", pa.int64()), ("ingested_at", pa.timestamp("us", tz="UTC"))]
    )
    return TableSpec(
        name=config.target.table,
        schema=schema,
        partition_by=tuple(config.target.partition_by),
        description=config.description or f"Target table of ingest pipeline {config.name}.",
        config_owner=f"pipeline {config.name}",
    )


def quarantine_spec(config: PipelineConfig) -> TableSpec:
    return TableSpec(
        name=config.target.quarantine_table,
        schema=QUARANTINE_SCHEMA,
        partition_by=("pipeline", "quarantine_date"),
        stats_columns=("source_offset", "batch_id", "error_code"),
        description=f"Records pipeline {config.name} rejected: raw content, input columns, position, every reason.",
    )
