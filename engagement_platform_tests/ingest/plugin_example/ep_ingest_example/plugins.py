"""Example plugins, registered through the entry point groups `engagement_platform.converters` and
`engagement_platform.validators` (pyproject.toml); the platform's code knows nothing about them.

- phone_normalize: the DataFrame contract directly (a Converter, not a ColumnConverter): DataFrame ->
  (converted rows, error rows); the rows it rejects go no further.
- loyalty_score, nested_city, tier_number: Python code row by row (RowConverter); an exception, or a
  value that is not of the declared output type, is that row's error.
- unique_in_batch: a DataFrame-contract Validator (a value repeated within the batch), which needs the
  whole frame, not one row.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from engagement_platform.ingest.errors import CONVERT, ROW_ID, VALIDATE, error
from engagement_platform.ingest.plugins import Converter, RowConverter, Validator


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _error_rows(df: DataFrame, err) -> DataFrame:
    """Rows of `df` as error rows in the one error schema (_row_id + the error fields)."""
    return df.select(ROW_ID, err.alias("_e")).select(ROW_ID, "_e.*")


class NormalizePhone(Converter):
    """Phone numbers to +<country code><10 digits>; anything else is a `bad_phone` error."""

    class Params(_Params):
        column: str
        country_code: str = "1"

    def convert(self, df: DataFrame) -> tuple[DataFrame, DataFrame]:
        column, code = F.col(self.params.column), self.params.country_code
        digits = F.regexp_replace(column, r"[^0-9]", "")
        national = F.when(F.length(digits) == 10, digits).when(
            (F.length(digits) == 10 + len(code)) & digits.startswith(code), F.substring(digits, len(code) + 1, 10)
        )
        ok = column.isNull() | national.isNotNull()
        converted = df.where(ok).withColumn(self.params.column, F.concat(F.lit(f"+{code}"), national))
        message = F.format_string("'%s' is not a phone number (10 digits, or +" + code + " and 10 digits)", column)
        errors = _error_rows(df.where(~ok), error(CONVERT, self.name, self.params.column, "bad_phone", message, column))
        return converted, errors


class LoyaltyScore(RowConverter):
    """score = 1000 // points, in Python: 0 points (ZeroDivisionError) or text (ValueError) raise."""

    class Params(_Params):
        points: str = "points"
        to: str = "score"

    def input_columns(self):
        return (self.params.points,)

    def output_types(self):
        return {self.params.to: "int"}

    def convert_row(self, values):
        points = values[self.params.points]
        return {self.params.to: None if points is None else 1000 // int(points)}


class NestedCity(RowConverter):
    """city = profile.address.city, tidied, in Python: a profile without an address raises TypeError."""

    class Params(_Params):
        column: str = "profile"
        to: str = "city"

    def input_columns(self):
        return (self.params.column,)

    def output_types(self):
        return {self.params.to: "string"}

    def convert_row(self, values):
        return {self.params.to: values[self.params.column]["address"]["city"].strip().title()}


class TierNumber(RowConverter):
    """tier = 1, 2, 3 for bronze, silver, gold, in Python. Its bug: an unknown level comes back as
    the text itself, not an int; the pipeline makes that the row's error instead of failing the batch."""

    class Params(_Params):
        column: str = "level"
        to: str = "tier"

    TIERS = {"bronze": 1, "silver": 2, "gold": 3}

    def input_columns(self):
        return (self.params.column,)

    def output_types(self):
        return {self.params.to: "int"}

    def convert_row(self, values):
        level = values[self.params.column]
        return {self.params.to: self.TIERS.get(level, level)}


class UniqueInBatch(Validator):
    """Every row whose value appears more than once in the batch gets a `duplicate_in_batch` error."""

    class Params(_Params):
        column: str

    @classmethod
    def check_config(cls, params, config):
        if params.column not in config.target.columns:
            return [("column", f"'{params.column}' is not a target column")]
        return []

    def validate(self, df: DataFrame) -> DataFrame:
        value = F.col(self.params.column)
        counted = df.where(value.isNotNull()).select(
            ROW_ID, value.alias("_v"), F.count("*").over(Window.partitionBy(value)).alias("_n")
        )
        message = F.format_string("'%s' appears %d times in the batch", F.col("_v").cast("string"), F.col("_n"))
        return _error_rows(
            counted.where(F.col("_n") > 1),
            error(VALIDATE, self.name, self.params.column, "duplicate_in_batch", message, F.col("_v")),
        )


def not_a_plugin():
    """Registered as a validator by mistake: loading a pipeline that names it must say so."""
