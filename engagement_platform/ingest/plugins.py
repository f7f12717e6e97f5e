"""Plugin contracts: what a converter or validator is, and how column plugins run (registry.py finds them).

Contracts, as in Adobe's "Composable Data Processing with Apache Spark":
- Converter: DataFrame -> (converted DataFrame, error DataFrame). A row that fails goes no further.
- Validator: DataFrame -> error DataFrame. Every validator sees every converted row.
Error DataFrames have the one error schema (`errors.ERROR_FRAME_DDL`: _row_id + error fields), and
converted frames keep `_row_id`.

Most plugins are column expressions, so they subclass ColumnConverter / ColumnValidator: they return
Spark columns (outputs, and an error struct or null per row) and the pipeline fuses all of them into
one projection instead of joining a DataFrame per plugin. The DataFrame contract still holds for them
(`convert`/`validate` are derived), and any plugin may implement the DataFrame contract directly.
Python code runs row by row through RowConverter, which traps each row's exception as its error.

Other teams register plugins without touching this package, through the entry point groups
`engagement_platform.converters` and `engagement_platform.validators` (name = plugin name,
value = "module:Class").
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from engagement_platform.ingest.errors import CONVERT, ERROR_FIELDS, ERRORS, ROW_ID, VALIDATE, error, gather

if TYPE_CHECKING:
    from engagement_platform.ingest.config import ColumnSpec


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Plugin:
    """Base of every plugin: built from validated params and the pipeline's target schema."""

    Params: ClassVar[type[BaseModel]] = NoParams

    def __init__(self, name: str, params: BaseModel, target: dict[str, ColumnSpec]):
        self.name = name
        self.params = params
        self.target = target


class Converter(Plugin):
    stage = CONVERT

    def convert(self, df: DataFrame) -> tuple[DataFrame, DataFrame]:
        raise NotImplementedError


class Validator(Plugin):
    stage = VALIDATE

    def validate(self, df: DataFrame) -> DataFrame:
        raise NotImplementedError


class ColumnConverter(Converter):
    """A converter made of column expressions over the current row.

    prepare(): optional helper columns computed first (e.g. one Python UDF call whose struct result
    both outputs and errors read), visible to columns() and errors() under their names.
    columns(): output columns (new or replacing same-named ones). errors(): error-or-null columns,
    evaluated on the input row (and prepared helpers), never on this plugin's own outputs.
    drops: input columns the output leaves out (a class attribute or a property).
    """

    @property
    def drops(self) -> tuple[str, ...]:
        return ()

    def prepare(self) -> dict[str, Column]:
        return {}

    def columns(self) -> dict[str, Column]:
        return {}

    def errors(self) -> list[Column]:
        return []

    def err(self, column: str | None, code: str, message: Column | str, value: Column | None = None) -> Column:
        return error(CONVERT, self.name, column, code, message, value)

    def convert(self, df: DataFrame) -> tuple[DataFrame, DataFrame]:
        staged = apply_column_converters(df.withColumn(ERRORS, gather([])), [self])
        return split_frame(staged)


class ColumnValidator(Validator):
    """A validator made of column expressions: errors() returns error-or-null columns."""

    def errors(self) -> list[Column]:
        return []

    def err(self, column: str | None, code: str, message: Column | str, value: Column | None = None) -> Column:
        return error(VALIDATE, self.name, column, code, message, value)

    def validate(self, df: DataFrame) -> DataFrame:
        return explode_errors(df.select(ROW_ID, gather(self.errors()).alias(ERRORS)))


class RowConverter(ColumnConverter):
    """Python code, one row at a time: convert_row(values) -> dict of outputs.

    Runs as an Arrow-optimized Python UDF; an exception on a row becomes that row's error
    (error_code `plugin_exception`, the exception in the message), never a failed batch.
    """

    inputs: ClassVar[tuple[str, ...]] = ()  # or override input_columns()
    outputs: ClassVar[dict[str, str]] = {}  # output column -> Spark type; or override output_types()

    def input_columns(self) -> tuple[str, ...]:
        return self.inputs

    def output_types(self) -> dict[str, str]:
        return self.outputs

    def convert_row(self, values: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _result(self) -> str:
        return f"__{self.name}_result"

    def prepare(self) -> dict[str, Column]:
        names, outputs = self.input_columns(), self.output_types()
        ddl = ",".join([f"`{k}`:{t}" for k, t in outputs.items()] + ["__error:string"])
        udf = F.udf(_trapped(self.convert_row, names, dict(outputs)), f"struct<{ddl}>", useArrow=True)
        return {self._result(): udf(*[F.col(n) for n in names])}

    def columns(self) -> dict[str, Column]:
        return {k: F.col(f"{self._result()}.`{k}`") for k in self.output_types()}

    def errors(self) -> list[Column]:
        failure = F.col(f"{self._result()}.__error")
        return [F.when(failure.isNotNull(), self.err(None, "plugin_exception", failure))]


# Output types checked row by row in Python: a value Arrow cannot take as the declared type would
# otherwise fail the whole batch when Spark converts the UDF's results (strings: Spark coerces anything).
_ARROW_TYPES = {
    "boolean": "bool_",
    "int": "int32",
    "integer": "int32",
    "short": "int16",
    "long": "int64",
    "bigint": "int64",
    "double": "float64",
    "float": "float32",
    "date": "date32",
}


def _typed(name: str, type_: str, value: Any) -> Any:
    import pyarrow as pa

    if value is None:
        return None
    if type_ == "timestamp":
        arrow = pa.timestamp("us", tz="UTC")
    elif type_.startswith("decimal("):
        arrow = pa.decimal128(*(int(x) for x in type_[8:-1].split(",")))
    elif type_ in _ARROW_TYPES:
        arrow = getattr(pa, _ARROW_TYPES[type_])()
    else:
        return value  # string (Spark coerces) and nested types: left to Spark
    try:
        return pa.scalar(value, type=arrow).as_py()
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        raise TypeError(f"output '{name}' is {value!r}, not a {type_}") from None


def _trapped(
    fn: Callable[[dict], dict], names: tuple[str, ...], outputs: dict[str, str]
) -> Callable[..., dict[str, Any]]:
    def run(*values: Any) -> dict[str, Any]:
        try:
            result = fn(dict(zip(names, values)))
            return {**{k: _typed(k, t, result.get(k)) for k, t in outputs.items()}, "__error": None}
        except Exception as exc:  # noqa: BLE001 - any failure of plugin code is this row's error
            where = traceback.extract_tb(exc.__traceback__)[-1]
            return {
                **{k: None for k in outputs},
                "__error": f"{type(exc).__name__}: {exc} (at {where.name}:{where.lineno})",
            }

    return run


def apply_column_converters(
    df: DataFrame, converters: list[ColumnConverter], columns: list[str] | None = None
) -> DataFrame:
    """Apply column converters in order on a frame with `_errors`; a row that already has errors
    keeps them and gets no new ones (it goes no further), so each row reports its first failure.
    `columns`: the frame's columns when the caller knows them. The converters' own columns are followed
    here, not asked of Spark: on Spark Connect each `df.columns` is an analysis round trip of the whole plan."""
    if not converters:
        return df
    names = list(df.columns) if columns is None else list(columns)
    for conv in converters:
        prepared = conv.prepare()
        if prepared:
            df = df.select("*", *[c.alias(n) for n, c in prepared.items()])
        outputs = conv.columns()
        clean = F.size(ERRORS) == 0
        new_errors = F.when(clean, gather(conv.errors())).otherwise(F.col(ERRORS))
        kept = [c for c in names if c not in outputs and c not in conv.drops and c != ERRORS and c not in prepared]
        df = df.select(
            *[F.col(f"`{c}`") for c in kept], *[col.alias(n) for n, col in outputs.items()], new_errors.alias(ERRORS)
        )
        names = [*kept, *outputs, ERRORS]
    return df


def split_frame(staged: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(rows without errors, their `_errors` dropped; error rows in the error schema)."""
    good = staged.where(F.size(ERRORS) == 0).drop(ERRORS)
    return good, explode_errors(staged.where(F.size(ERRORS) > 0).select(ROW_ID, ERRORS))


def explode_errors(df: DataFrame) -> DataFrame:
    return df.select(ROW_ID, F.explode(ERRORS).alias("e")).select(
        ROW_ID, *[F.col(f"e.{f}").alias(f) for f in ERROR_FIELDS]
    )
