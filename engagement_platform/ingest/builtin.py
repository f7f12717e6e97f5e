"""Built-in converters and validators (the composable-ingest talk's example and the common constraints).

All are column expressions, so the pipeline fuses them into one projection. Conversions use Spark's
try_* functions: a value that cannot convert gives null and the row gets an error, never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pyspark.sql import Column
from pyspark.sql import functions as F

from engagement_platform.ingest.column_types import TYPE, bound_problem, check_formats
from engagement_platform.ingest.plugins import ColumnConverter, ColumnValidator

if TYPE_CHECKING:
    from engagement_platform.ingest.config import ColumnSpec, PipelineConfig


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _col(name: str) -> Column:
    return F.col(".".join(f"`{part}`" for part in name.split(".")))  # nested fields: a.b.c


def _known_type(value: str | None) -> str | None:
    """A plugin's `type` parameter is checked at load time, like the target schema's types."""
    if value is not None and not TYPE.match(value):
        raise ValueError(
            f"unknown type '{value}' (string, boolean, int, long, double, float, date, timestamp, decimal(p,s))"
        )
    return value


def _shown(values: Iterable[object]) -> str:
    return ", ".join(str(v) for v in values)


def convert_text(column: Column, type_: str, formats: list[str] | None) -> Column:
    """Text -> type, null when it does not convert (dates and timestamps try each pattern in order)."""
    if type_ in ("date", "timestamp") and formats:
        parsed = F.coalesce(*[F.try_to_timestamp(column, F.lit(fmt)) for fmt in formats])
        return parsed.cast("date") if type_ == "date" else parsed
    if type_ == "string":
        return column.cast("string")
    return column.try_cast(type_)


# ---- converters -----------------------------------------------------------------------------------


class Rename(ColumnConverter):
    class Params(_Params):
        from_: str = Field(alias="from")
        to: str

    params: Params  # as validated and stored by Plugin.__init__

    def columns(self) -> dict[str, Column]:
        return {self.params.to: _col(self.params.from_)}

    @property
    def drops(self) -> tuple[str, ...]:
        return (self.params.from_,)


class Concat(ColumnConverter):
    """Join several text columns into one (nulls skipped), e.g. first + last name -> full name."""

    class Params(_Params):
        columns: list[str] = Field(min_length=2)
        to: str
        separator: str = " "
        required: bool = True  # error when every part is null

    params: Params  # as validated and stored by Plugin.__init__

    def columns(self) -> dict[str, Column]:
        return {self.params.to: F.concat_ws(self.params.separator, *[_col(c) for c in self.params.columns])}

    def errors(self) -> list[Column]:
        if not self.params.required:
            return []
        all_null = F.coalesce(*[_col(c) for c in self.params.columns]).isNull()
        return [
            F.when(
                all_null,
                self.err(self.params.to, "missing_value", f"none of {_shown(self.params.columns)} has a value"),
            )
        ]


class Split(ColumnConverter):
    """Split one text column into several, e.g. name -> first_name, last_name (the rest goes to the last)."""

    class Params(_Params):
        column: str
        into: list[str] = Field(min_length=2)
        separator: str = " "
        min_parts: int | None = None  # default: all of `into`

    params: Params  # as validated and stored by Plugin.__init__

    def _parts(self) -> Column:
        literal = "".join(c if c.isalnum() else "\\" + c for c in self.params.separator)  # split() takes a regex
        return F.split(F.trim(_col(self.params.column)), F.lit(literal), len(self.params.into))

    def columns(self) -> dict[str, Column]:
        parts = self._parts()
        return {name: F.get(parts, i) for i, name in enumerate(self.params.into)}

    def errors(self) -> list[Column]:
        need = self.params.min_parts or len(self.params.into)
        value = _col(self.params.column)
        too_few = value.isNull() | (F.size(self._parts()) < need)
        message = F.format_string(f"'%s' does not split into {need} parts on '{self.params.separator}'", value)
        return [F.when(too_few, self.err(self.params.column, "split_mismatch", message, value))]


class Cast(ColumnConverter):
    """Text -> a typed column (e.g. a birthday string to a date with its pattern).

    default_from: when the value is missing, take the first non-null of these columns cast to the
    type (e.g. engagement_date from an already converted event_time); a present but invalid value
    is still an error, never silently replaced."""

    class Params(_Params):
        column: str
        to: str | None = None
        type: str
        formats: list[str] | None = None
        default_from: list[str] = []

        _type = field_validator("type")(_known_type)
        _formats = field_validator("formats")(check_formats)

    params: Params  # as validated and stored by Plugin.__init__

    def _converted(self) -> Column:
        return convert_text(_col(self.params.column), self.params.type, self.params.formats)

    def columns(self) -> dict[str, Column]:
        converted = self._converted()
        if self.params.default_from:
            fallback = F.coalesce(*[_as(_col(c), self.params.type) for c in self.params.default_from])
            converted = F.when(_col(self.params.column).isNull(), fallback).otherwise(converted)
        return {self.params.to or self.params.column: converted}

    @property
    def drops(self) -> tuple[str, ...]:
        return (self.params.column,) if self.params.to and self.params.to != self.params.column else ()

    def errors(self) -> list[Column]:
        value = _col(self.params.column)
        hint = f" (formats: {_shown(self.params.formats)})" if self.params.formats else ""
        message = F.format_string(f"'%s' is not a valid {self.params.type}{hint}", value)
        return [
            F.when(
                value.isNotNull() & self._converted().isNull(),
                self.err(self.params.column, "wrong_type", message, value),
            )
        ]


class MapValues(ColumnConverter):
    """Map source codes to target values (e.g. 'G' -> 'gold'); unmapped values are errors unless a default is set."""

    class Params(_Params):
        column: str
        to: str | None = None
        mapping: dict[str, str] = Field(min_length=1)
        default: str | None = None
        case_sensitive: bool = False

    params: Params  # as validated and stored by Plugin.__init__

    def _key(self) -> Column:
        value = _col(self.params.column)
        return value if self.params.case_sensitive else F.lower(value)

    def _mapped(self) -> Column:
        table = {(k if self.params.case_sensitive else k.lower()): v for k, v in self.params.mapping.items()}
        pairs = [x for k, v in table.items() for x in (F.lit(k), F.lit(v))]
        return F.coalesce(F.try_element_at(F.create_map(*pairs), self._key()), F.lit(self.params.default))

    def columns(self) -> dict[str, Column]:
        return {self.params.to or self.params.column: self._mapped()}

    def errors(self) -> list[Column]:
        if self.params.default is not None:
            return []
        value = _col(self.params.column)
        message = F.format_string(f"'%s' has no mapping (known: {_shown(self.params.mapping)})", value)
        return [
            F.when(
                value.isNotNull() & self._mapped().isNull(),
                self.err(self.params.column, "unmapped_value", message, value),
            )
        ]


class Coalesce(ColumnConverter):
    """Fill a column from the first non-null of others (e.g. engagement_date from event_time)."""

    class Params(_Params):
        column: str
        sources: list[str] = Field(min_length=1)
        type: str | None = None  # cast each source to this type first

        _type = field_validator("type")(_known_type)

    params: Params  # as validated and stored by Plugin.__init__

    def columns(self) -> dict[str, Column]:
        cast = (lambda c: c.try_cast(self.params.type)) if self.params.type else (lambda c: c)
        return {self.params.column: F.coalesce(*[cast(_col(c)) for c in (self.params.column, *self.params.sources)])}

    def errors(self) -> list[Column]:
        """The value to use (the first present one) does not convert: an error, never silently skipped."""
        if not self.params.type:
            return []
        out, before_missing = [], F.lit(True)
        for name in (self.params.column, *self.params.sources):
            value = _col(name)
            message = F.format_string(f"'%s' is not a valid {self.params.type}", value.cast("string"))
            bad = before_missing & value.isNotNull() & value.try_cast(self.params.type).isNull()
            out.append(F.when(bad, self.err(name, "wrong_type", message, value)))
            before_missing = before_missing & value.isNull()
        return out


class Conform(ColumnConverter):
    """The last converter, added by the pipeline: every target column gets its target type.

    Text columns convert (with the column's formats for dates); typed columns are cast when they
    differ. Extra columns are dropped by the pipeline's final projection, not here."""

    def __init__(self, name: str, params: BaseModel, target: dict[str, ColumnSpec], current_types: dict[str, str]):
        super().__init__(name, params, target)
        self.current = current_types

    def _needs(self) -> Iterator[tuple[str, ColumnSpec, str]]:
        for name, spec in self.target.items():
            have = self.current.get(name)
            if have is not None and have != _spark_type_name(spec.type):
                yield name, spec, have

    def columns(self) -> dict[str, Column]:
        return {
            name: (
                convert_text(_col(name), spec.type, spec.formats)
                if have == "string"
                else _col(name).try_cast(spec.type)
            )
            for name, spec, have in self._needs()
        }

    def errors(self) -> list[Column]:
        out = []
        for name, spec, have in self._needs():
            value = _col(name)
            converted = convert_text(value, spec.type, spec.formats) if have == "string" else value.try_cast(spec.type)
            hint = f" (formats: {_shown(spec.formats)})" if spec.formats else ""
            message = F.format_string(f"'%s' is not a valid {spec.type}{hint}", value.cast("string"))
            out.append(F.when(value.isNotNull() & converted.isNull(), self.err(name, "wrong_type", message, value)))
        return out


def _as(column: Column, type_: str) -> Column:
    """A source column as `type_`, null if it does not convert; dates go through timestamp so a
    timestamp with an offset lands on its UTC (session time zone) day."""
    return column.try_cast("timestamp").cast("date") if type_ == "date" else column.try_cast(type_)


def shown_bound(value: float | str | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _spark_type_name(type_: str) -> str:
    return {"integer": "int", "long": "bigint", "short": "smallint"}.get(type_, type_).replace(" ", "")


# ---- validators -----------------------------------------------------------------------------------


class Required(ColumnValidator):
    class Params(_Params):
        columns: list[str] = Field(min_length=1)
        allow_blank: bool = False  # a string of only spaces counts as missing unless allowed

    params: Params  # as validated and stored by Plugin.__init__

    def errors(self) -> list[Column]:
        out = []
        for name in self.params.columns:
            value = _col(name)
            missing = value.isNull()
            if not self.params.allow_blank and self.target.get(name) is not None and self.target[name].type == "string":
                missing = missing | (F.trim(value) == "")
            out.append(
                F.when(missing, self.err(name, "missing_required", f"required field '{name}' is missing or empty"))
            )
        return out


class Enum(ColumnValidator):
    class Params(_Params):
        column: str
        values: list[str] = Field(min_length=1)

    params: Params  # as validated and stored by Plugin.__init__

    def errors(self) -> list[Column]:
        value = _col(self.params.column)
        message = F.format_string(f"'%s' is not one of {_shown(self.params.values)}", value)
        return [
            F.when(
                value.isNotNull() & ~value.isin(*self.params.values),
                self.err(self.params.column, "not_in_enum", message, value),
            )
        ]


class Range(ColumnValidator):
    class Params(_Params):
        column: str
        min: float | str | None = None
        max: float | str | None = None

        @model_validator(mode="after")
        def _bounded(self) -> Self:
            if self.min is None and self.max is None:
                raise ValueError("give min, max or both")
            return self

    params: Params  # as validated and stored by Plugin.__init__

    @classmethod
    def check_config(cls, params: Range.Params, config: PipelineConfig) -> list[tuple[str, str]]:
        """Bounds that cannot compare with the target column's type would fail the batch in Spark."""
        spec = config.target.columns.get(params.column)
        return [
            (key, problem)
            for key in ("min", "max")
            if spec and (problem := bound_problem(spec.type, getattr(params, key)))
        ]

    def errors(self) -> list[Column]:
        value = _col(self.params.column)
        low, high = self.params.min, self.params.max
        outside = F.lit(False)
        if low is not None:
            outside = outside | (value < F.lit(low))
        if high is not None:
            outside = outside | (value > F.lit(high))
        bounds = f"[{shown_bound(low)}, {shown_bound(high)}]"
        message = F.format_string(f"%s is outside {bounds}", value.cast("string"))
        return [F.when(value.isNotNull() & outside, self.err(self.params.column, "out_of_range", message, value))]


class Regex(ColumnValidator):
    class Params(_Params):
        column: str
        pattern: str

        @field_validator("pattern")
        @classmethod
        def _compiles(cls, value: str) -> str:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"regex does not compile: {exc}") from exc
            return value

    params: Params  # as validated and stored by Plugin.__init__

    def errors(self) -> list[Column]:
        value = _col(self.params.column)
        message = F.format_string(f"'%s' does not match {self.params.pattern}", value)
        matches = F.regexp_like(value, F.lit(self.params.pattern))
        return [F.when(value.isNotNull() & ~matches, self.err(self.params.column, "pattern_mismatch", message, value))]


def schema_validators(target: dict[str, ColumnSpec]) -> list[ColumnValidator]:
    """The target schema's own constraints (required, enum, min/max, regex) as validators."""
    out: list[ColumnValidator] = []
    required = [name for name, spec in target.items() if spec.required]
    if required:
        out.append(Required("target_schema", Required.Params(columns=required), target))
    for name, spec in target.items():
        if spec.enum:
            out.append(Enum("target_schema", Enum.Params(column=name, values=spec.enum), target))
        if spec.min is not None or spec.max is not None:
            out.append(Range("target_schema", Range.Params(column=name, min=spec.min, max=spec.max), target))
        if spec.regex:
            out.append(Regex("target_schema", Regex.Params(column=name, pattern=spec.regex), target))
    return out


CONVERTERS = {
    "rename": Rename,
    "concat": Concat,
    "split": Split,
    "cast": Cast,
    "map_values": MapValues,
    "coalesce": Coalesce,
}
VALIDATORS = {"required": Required, "enum": Enum, "range": Range, "regex": Regex}
