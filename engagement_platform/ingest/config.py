"""Pipeline configuration: a YAML file declares source, target schema, converters and validators.

Everything is checked when the file is loaded, not when the first batch runs: unknown keys, wrong
types, unknown plugins, a plugin's own parameters, target types, regexes and cross-references.
Every problem is reported as `<file>: <key path>: <problem>`, all of them at once.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engagement_platform.ingest.column_types import NUMERIC_OR_TEMPORAL, TYPE, bound_problem, check_formats
from engagement_platform.ingest.registry import plugin_problems, resolve

NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
# Target column types the conform step can produce from text (Spark SQL names).


class PipelineConfigError(ValueError):
    """A pipeline file is invalid; the message names the file, each bad key and the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ColumnSpec(_Strict):
    type: str = "string"
    required: bool = False
    enum: list[str] | None = None
    min: float | str | None = None  # numbers, or ISO dates for date/timestamp columns
    max: float | str | None = None
    regex: str | None = None
    formats: list[str] | None = None  # date/timestamp patterns tried in order (Spark datetime patterns)
    description: str | None = None

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if not TYPE.match(value):
            raise ValueError(
                f"unknown type '{value}' (string, boolean, int, long, double, float, date, timestamp, decimal(p,s))"
            )
        return value

    @field_validator("formats")
    @classmethod
    def _patterns(cls, value: list[str] | None) -> list[str] | None:
        return check_formats(value)

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"regex does not compile: {exc}") from exc
        return value

    @model_validator(mode="after")
    def _constraints_fit_type(self) -> ColumnSpec:
        if self.enum is not None and self.type != "string":
            raise ValueError("enum applies to string columns only")
        if (self.min is not None or self.max is not None) and not NUMERIC_OR_TEMPORAL.match(self.type):
            raise ValueError("min/max apply to numeric, date and timestamp columns only")
        for key in ("min", "max"):
            problem = bound_problem(self.type, getattr(self, key))
            if problem:
                raise ValueError(f"{key}: {problem}")
        if self.formats and self.type not in ("date", "timestamp"):
            raise ValueError("formats apply to date and timestamp columns only")
        return self


class SourceSpec(_Strict):
    format: Literal["csv", "json", "jsonl", "kafka"]
    path: str | None = None  # glob under the landing root, for file sources
    topic: str | None = None  # for kafka
    columns: dict[str, str] = Field(min_length=1)  # input column -> Spark type (text formats: keep string)
    options: dict[str, str | int | bool] = {}
    max_record_bytes: int = Field(default=1_048_576, gt=0)
    # Landing files waiting together are read as one batch (one run), up to these bounds: a backlog of
    # files is caught up in a few runs, not one run per file. A file larger than the byte bound is a batch alone.
    max_files_per_batch: int = Field(default=100, gt=0)
    max_bytes_per_batch: int = Field(default=256 << 20, gt=0)  # a batch's files, read by its tasks in one run

    @model_validator(mode="after")
    def _where_from(self) -> SourceSpec:
        if self.format == "kafka" and not self.topic:
            raise ValueError("a kafka source needs 'topic'")
        if self.format != "kafka" and not self.path:
            raise ValueError(f"a {self.format} source needs 'path' (a glob under the landing root)")
        return self


class TargetSpec(_Strict):
    table: str
    quarantine_table: str
    partition_by: list[str] = []
    columns: dict[str, ColumnSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> TargetSpec:
        for name in (self.table, self.quarantine_table):
            if not NAME.match(name):
                raise ValueError(f"table name '{name}' must be lower_snake_case")
        if self.table == self.quarantine_table:
            raise ValueError("table and quarantine_table must differ")
        missing = [c for c in self.partition_by if c not in self.columns]
        if missing:
            raise ValueError(f"partition_by names columns not in the target schema: {missing}")
        return self


class ErrorRatePolicy(_Strict):
    max_error_rate: float = Field(default=0.05, ge=0, le=1)  # rejected records / records read
    severity: Literal["warn", "block"] = "warn"


class SuppressionSpec(_Strict):
    """The pipeline's records name people: drop the records of subjects an erasure suppressed
    (lake/suppression.py), before anything is stored, and count them by hash."""

    list_table: (
        str  # the lake's suppression list: engagement_erased_subjects (per org) or profile_erased_subjects (per tenant)
    )
    subject_columns: list[str] = Field(min_length=1)  # target columns that hold a person's id
    scope_column: str | None = None  # the target column holding each record's org / tenant
    scope: str | None = None  # or one org / tenant for every record of the pipeline

    @model_validator(mode="after")
    def _one_scope(self) -> SuppressionSpec:
        if (self.scope_column is None) == (self.scope is None):
            raise ValueError("give exactly one of scope_column (a target column) and scope (one org / tenant)")
        if not NAME.match(self.list_table) or not self.list_table.endswith(SUPPRESSION_LIST_SUFFIX):
            raise ValueError(
                f"list_table '{self.list_table}' must be a suppression list table (name ending in {SUPPRESSION_LIST_SUFFIX})"
            )
        return self


SUPPRESSION_LIST_SUFFIX = "_erased_subjects"


class PluginRef(_Strict):
    """One `- plugin: <name>` entry; every other key is the plugin's own parameter."""

    model_config = ConfigDict(extra="allow", frozen=True)
    plugin: str

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class PipelineConfig(_Strict):
    name: str
    description: str = ""
    source: SourceSpec
    target: TargetSpec
    converters: list[PluginRef] = []
    validators: list[PluginRef] = []
    error_rate: ErrorRatePolicy = ErrorRatePolicy()
    suppression: SuppressionSpec | None = None

    @model_validator(mode="after")
    def _suppression_columns(self) -> PipelineConfig:
        spec = self.suppression
        if spec is not None:
            named = [*spec.subject_columns, *([spec.scope_column] if spec.scope_column else [])]
            missing = [c for c in named if c not in self.target.columns]
            if missing:
                raise ValueError(f"suppression names columns not in the target schema: {missing}")
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.match(value):
            raise ValueError(f"'{value}' must be lower_snake_case (letters, digits, _), starting with a letter")
        return value


def load_pipeline(path: str | Path) -> PipelineConfig:
    """Parse and check one pipeline file, plugins included; raise PipelineConfigError listing every problem."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise PipelineConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        raise PipelineConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise PipelineConfigError(f"{path}: top level must be a mapping of keys (name, source, target...)")
    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as exc:  # unknown plugins are reported with the schema's problems
        unknown = [f"{path}: {key}: {problem}" for key, problem in _unknown_plugins(data)]
        raise PipelineConfigError("\n".join([_describe(path, exc), *unknown])) from None
    problems = plugin_problems(config)
    if problems:
        raise PipelineConfigError("\n".join(f"{path}: {key}: {problem}" for key, problem in problems))
    return config


@cache
def load_kafka_pipeline(path: str | Path, topic: str, **source: Any) -> PipelineConfig:
    """A Kafka pipeline file with its source's topic, and any other `source` key given (e.g.
    max_record_bytes; None keeps the file's), set by the stream: the plan names the topic a batch reads."""
    config = load_pipeline(path)
    if config.source.format != "kafka":
        raise PipelineConfigError(f"{path}: source.format: '{config.source.format}' is not kafka")
    update = {"topic": topic, **{key: value for key, value in source.items() if value is not None}}
    return config.model_copy(update={"source": config.source.model_copy(update=update)})


def load_pipelines(folder: str | Path) -> list[PipelineConfig]:
    configs = [load_pipeline(p) for p in sorted(Path(folder).glob("*.y*ml"))]
    names = [c.name for c in configs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PipelineConfigError(f"{folder}: pipeline names used twice: {duplicates}")
    return configs


def _unknown_plugins(data: dict) -> list[tuple[str, str]]:
    problems = []
    for kind in ("converters", "validators"):
        entries = data.get(kind)
        for i, ref in enumerate(entries if isinstance(entries, list) else []):
            if isinstance(ref, dict) and isinstance(ref.get("plugin"), str):
                try:
                    resolve(kind, ref["plugin"])
                except (LookupError, TypeError, ImportError, AttributeError) as exc:
                    problems.append((f"{kind}[{i}].plugin", str(exc)))
    return problems


def _describe(path: Path, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".") or "(top level)"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown key"
        lines.append(f"{path}: {key}: {message}")
    return "\n".join(lines)
