"""A configured pipeline: parse -> converters -> conform -> validators, errors gathered per row.

The whole pipeline is one Spark plan whose rows carry their errors (`_errors`): column plugins are
fused into projections, DataFrame-contract plugins are joined back by `_row_id`. One Arrow result
comes back to the driver and splits into the target rows (no errors) and the quarantine rows (one
per error, with the record's raw bytes, input columns and source position). `errors_frame`,
`good_frame` and `quarantine_frame` give the same split as Spark DataFrames, with the quarantine
built the composable-ingest talk's way: the unioned errors joined back to the input by row id. Kafka-fed streams
run a planned slice through `record_tasks.validate_kafka_slice` and add what they check on the driver (a batch-level
rule) with `reject_on_driver`, in the same error schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from engagement_platform.ingest.builtin import Conform, schema_validators
from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.ingest.errors import (
    ERROR_FIELDS,
    ERRORS,
    RAW,
    ROW_ID,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    gather,
    no_errors,
)
from engagement_platform.ingest.plugins import (
    ColumnConverter,
    ColumnValidator,
    Converter,
    NoParams,
    Validator,
    apply_column_converters,
    explode_errors,
)
from engagement_platform.ingest.registry import instantiate
from engagement_platform.ingest.sources import INPUT, fetch_values, read_kafka
from engagement_platform.streams.kafka import KafkaClient

if TYPE_CHECKING:
    from engagement_platform.streams.planning import BatchPlan

CONVERTED = "_converted"  # the row passed every converter: validators see exactly these rows
CARRIED = (ROW_ID, SOURCE_PARTITION, SOURCE_OFFSET, RAW, INPUT)  # travel with every row, whatever plugins do


class PipelineBuildError(ValueError):
    """The plugins do not produce the target schema (found when the plan is built, before any data runs)."""


@dataclass
class Pipeline:
    config: PipelineConfig
    converters: list[Converter]
    validators: list[Validator]

    @classmethod
    def from_config(cls, config: PipelineConfig) -> Pipeline:
        target = config.target.columns
        return cls(
            config,
            [instantiate("converters", ref, target) for ref in config.converters],
            [*schema_validators(target), *[instantiate("validators", ref, target) for ref in config.validators]],
        )

    @property
    def target_columns(self) -> list[str]:
        return list(self.config.target.columns)

    def transform(self, parsed: DataFrame, keep: tuple[str, ...] = ()) -> DataFrame:
        """Parsed input -> one frame: carried columns, target columns, `_errors` of every stage.
        Raw bytes and input columns are kept only on rows with errors (nobody needs them otherwise).

        `keep`: columns the caller added to `parsed` (e.g. a costly parse that both a validator and
        the caller use, computed once) and wants back; column converters pass them through."""
        df = self._convert(parsed)
        df = self._validate(df)
        bad = F.size(ERRORS) > 0
        return df.select(
            ROW_ID,
            SOURCE_PARTITION,
            SOURCE_OFFSET,
            *[F.col(f"`{c}`") for c in self.target_columns],
            *[F.col(f"`{c}`") for c in keep],
            ERRORS,
            F.when(bad, F.col(RAW)).alias(RAW),
            F.when(bad, F.to_json(INPUT)).alias(INPUT),
        )

    def _convert(self, df: DataFrame) -> DataFrame:
        fused: list[ColumnConverter] = []
        for conv in self.converters:
            if isinstance(conv, ColumnConverter):
                fused.append(conv)
                continue
            df = apply_frame_converter(apply_column_converters(df, fused), conv)
            fused = []
        df = apply_column_converters(df, fused)
        # One schema request: on Spark Connect every df.columns / df.dtypes is a round trip to the server.
        dtypes = {f.name: f.dataType.simpleString() for f in df.schema.fields}
        missing = [c for c in self.target_columns if c not in dtypes]
        if missing:
            raise PipelineBuildError(
                f"pipeline {self.config.name}: target columns {missing} come from no source column and no converter "
                f"(columns after the converters: {[c for c in dtypes if c not in (*CARRIED, ERRORS)]})"
            )
        conform = Conform("conform", NoParams(), self.config.target.columns, dtypes)
        return apply_column_converters(df, [conform], list(dtypes))

    def _validate(self, df: DataFrame) -> DataFrame:
        """Every validator sees every converted row (rows that failed a converter are not validated),
        so a row reports all its validation errors at once."""
        columnar = [v for v in self.validators if isinstance(v, ColumnValidator)]
        df = df.withColumn(CONVERTED, F.size(ERRORS) == 0)
        found = gather([e for v in columnar for e in v.errors()])
        df = df.withColumn(ERRORS, F.when(F.col(CONVERTED), found).otherwise(F.col(ERRORS)))
        for validator in self.validators:
            if not isinstance(validator, ColumnValidator):
                df = apply_frame_validator(df, validator)
        return df.drop(CONVERTED)


def _errors_by_row(errors: DataFrame, name: str = ERRORS) -> DataFrame:
    return errors.groupBy(ROW_ID).agg(F.collect_list(F.struct(*ERROR_FIELDS)).alias(name))


def apply_frame_converter(df: DataFrame, conv: Converter) -> DataFrame:
    """Run a DataFrame-contract converter on the rows without errors and fold its result back in."""
    clean = df.where(F.size(ERRORS) == 0).drop(ERRORS)
    carried = clean.select(*CARRIED)
    plugin_input = clean.drop(*(c for c in CARRIED if c != ROW_ID))
    try:
        converted, errors = conv.convert(plugin_input)
    except Exception as exc:  # a plugin that breaks its contract fails loudly, naming itself
        raise RuntimeError(f"converter '{conv.name}' failed to build its plan: {exc}") from exc
    by_row = _errors_by_row(errors)
    failed_before = df.where(F.size(ERRORS) > 0).select(*CARRIED, ERRORS)
    failed_now = carried.join(by_row, ROW_ID)
    converted_ok = converted.join(by_row, ROW_ID, "left_anti").join(carried, ROW_ID).withColumn(ERRORS, no_errors())
    return converted_ok.unionByName(failed_before, allowMissingColumns=True).unionByName(
        failed_now, allowMissingColumns=True
    )


def apply_frame_validator(df: DataFrame, validator: Validator) -> DataFrame:
    """Run a DataFrame-contract validator on the converted rows; its errors join back by row id."""
    converted = df.where(F.col(CONVERTED)).drop(ERRORS, CONVERTED, *(c for c in CARRIED if c != ROW_ID))
    found = _errors_by_row(validator.validate(converted), "_found")
    joined = df.join(found, ROW_ID, "left")
    return joined.withColumn(ERRORS, F.concat(F.col(ERRORS), F.coalesce(F.col("_found"), no_errors()))).drop("_found")


# ---- the same split as DataFrames (the composable-ingest talk's union + join) ----------------------


def errors_frame(transformed: DataFrame) -> DataFrame:
    return explode_errors(transformed.where(F.size(ERRORS) > 0))


def good_frame(transformed: DataFrame, columns: list[str]) -> DataFrame:
    return transformed.where(F.size(ERRORS) == 0).select(*columns)


def quarantine_frame(errors: DataFrame, parsed: DataFrame) -> DataFrame:
    """Every error joined back to its input record (raw bytes, input columns, source position)."""
    return errors.join(
        parsed.select(ROW_ID, SOURCE_PARTITION, SOURCE_OFFSET, RAW, F.to_json(INPUT).alias(INPUT)), ROW_ID
    )


# ---- driver side ----------------------------------------------------------------------------------


def validated_kafka_frame(
    spark: SparkSession,
    config: PipelineConfig,
    bootstrap_servers: str,
    plan: BatchPlan,
    kafka_config: dict | None = None,
    transform: Callable[[DataFrame], DataFrame] | None = None,
) -> DataFrame:
    """A planned Kafka slice read, parsed and validated by Spark (the Spark record path), as a frame."""
    parsed = read_kafka(spark, config.source, bootstrap_servers, plan.topic, plan.ranges_json(), kafka_config)
    return (transform or Pipeline.from_config(config).transform)(parsed)


def reject_on_driver(
    validated: pa.Table,
    errors: list,
    flagged: list[int],
    bootstrap_servers: str,
    topic: str,
    kafka_config: dict | None = None,
) -> pa.Table:
    """`validated` (a Kafka slice) with the driver's `errors` column, and raw bytes plus input JSON for the
    rows the driver rejected (`flagged`): Spark returns raw bytes only for the rows it rejected itself."""
    if not flagged:
        return validated
    rows = validated.select([SOURCE_PARTITION, SOURCE_OFFSET]).to_pylist()
    wanted = {(rows[i][SOURCE_PARTITION], rows[i][SOURCE_OFFSET]): i for i in flagged}
    raw = fetch_values(KafkaClient(bootstrap_servers, kafka_config), topic, set(wanted))
    raws, inputs = validated[RAW].to_pylist(), validated[INPUT].to_pylist()
    for position, i in wanted.items():
        raws[i] = raw.get(position)
        inputs[i] = _input_json(raws[i])
    schema = validated.schema
    return (
        validated.set_column(schema.get_field_index(ERRORS), ERRORS, pa.array(errors, schema.field(ERRORS).type))
        .set_column(schema.get_field_index(RAW), RAW, pa.array(raws, schema.field(RAW).type))
        .set_column(schema.get_field_index(INPUT), INPUT, pa.array(inputs, pa.string()))
    )


def _input_json(raw: bytes | None) -> str | None:
    try:
        return json.dumps(json.loads(raw), sort_keys=True) if raw else None
    except ValueError:
        return None


@dataclass(frozen=True)
class QuarantineContext:
    pipeline: str
    batch_id: int
    source: str  # file path or topic
    at: datetime
    kafka: bool = False


def split_result(result: pa.Table, columns: list[str], ctx: QuarantineContext) -> tuple[pa.Table, pa.Table]:
    """(target rows, quarantine rows in QUARANTINE_SCHEMA): the Arrow twin of good_frame/quarantine_frame."""
    n_errors = pc.list_value_length(result[ERRORS])
    good = result.filter(pc.equal(n_errors, 0)).select(columns)
    return good, quarantine_rows(result.filter(pc.greater(n_errors, 0)), ctx)


def quarantine_rows(bad: pa.Table, ctx: QuarantineContext, org_column: str = "org_id") -> pa.Table:
    from engagement_platform.lake.quarantine import QUARANTINE_SCHEMA

    flat = pc.list_flatten(bad[ERRORS])
    parent = pc.list_parent_indices(bad[ERRORS])
    n = len(flat)

    def take(col: str) -> pa.ChunkedArray:
        return pc.take(bad[col], parent)

    partitions, offsets = take(SOURCE_PARTITION), take(SOURCE_OFFSET)
    position = (
        pc.binary_join_element_wise(pc.cast(partitions, pa.string()), pc.cast(offsets, pa.string()), ":")
        if ctx.kafka
        else pc.cast(offsets, pa.string())
    )
    constant = lambda value, type_: pa.repeat(pa.scalar(value, type_), n)  # noqa: E731
    columns = {
        "pipeline": constant(ctx.pipeline, pa.string()),
        "batch_id": constant(ctx.batch_id, pa.int64()),
        "row_id": pc.binary_join_element_wise(constant(ctx.source, pa.string()), position, ":"),
        "source": constant(ctx.source, pa.string()),
        "source_partition": pc.cast(partitions, pa.int32()),
        "source_offset": pc.cast(offsets, pa.int64()),
        "org_id": take(org_column) if org_column in bad.column_names else constant(None, pa.string()),
        "raw": pc.cast(take(RAW), pa.binary()),
        "input": take(INPUT) if INPUT in bad.column_names else constant(None, pa.string()),
        **{name: pc.struct_field(flat, name) for name in ERROR_FIELDS},
        "quarantined_at": constant(ctx.at, pa.timestamp("us", tz="UTC")),
        "quarantine_date": constant(ctx.at.date(), pa.date32()),
    }
    return pa.table({name: columns[name] for name in QUARANTINE_SCHEMA.names}, schema=QUARANTINE_SCHEMA)
