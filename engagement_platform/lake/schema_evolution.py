"""A table whose columns come from a pipeline's config, brought to the config's schema when a writer opens it.

What users of DLT, Hudi and Iceberg sinks expect: a config that gains a column keeps writing to its table (the
column is added, nullable: rows written before read null); a change that would rewrite or reinterpret what the
table holds is refused before anything is written, naming the pipeline, the column and the table. An optional
column the config no longer names stays in the table (new rows read null); a required one is refused, and so is
any column of a table that does not record which columns are required. The platform's own
tables are not checked here: their schemas change with the code (docs/operations/upgrade.md). Only the pipeline's own
writer evolves its table (DeltaLake.ensure_config_schema, before it computes a batch): an erasure or an upkeep
job rewriting the table's files takes the table as it is, so a config change never blocks an erasure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable, Field, Schema
from deltalake.exceptions import CommitFailedError

if TYPE_CHECKING:
    from engagement_platform.lake.delta import TableSpec


REQUIRED_KEY = "engagement_platform.required"  # a column's metadata: "true" / "false", as its config said


class SchemaChangeError(ValueError):
    """A config's schema that its existing table cannot take."""


def _type_name(delta_type: object) -> str:
    return getattr(delta_type, "type", None) or str(delta_type)


def schema_problems(table: DeltaTable, spec: TableSpec) -> tuple[list[str], list[Field]]:
    """(what the table cannot take, the columns to add)."""
    current = {f.name: f for f in table.schema().fields}
    wanted = Schema.from_arrow(spec.schema).fields
    named = {f.name for f in wanted}
    problems = [
        f"column '{name}' is in the table but not in the config, and {_why_kept(current[name])}"
        for name in current
        if name not in named and (current[name].metadata or {}).get(REQUIRED_KEY) != "false"
    ]
    problems += [
        f"column '{f.name}' is {_type_name(current[f.name].type)} in the table and {_type_name(f.type)} in the config"
        for f in wanted
        if f.name in current and current[f.name].type != f.type
    ]
    partitioned = tuple(table.metadata().partition_columns)
    if partitioned != tuple(spec.partition_by):
        problems.append(f"the table is partitioned by {list(partitioned)}, the config says {list(spec.partition_by)}")
    return problems, [
        Field(f.name, f.type, nullable=True, metadata=f.metadata) for f in wanted if f.name not in current
    ]


def _why_kept(field: Field) -> str:
    if (field.metadata or {}).get(REQUIRED_KEY) == "true":
        return "it is required: a required column cannot be removed (make it optional first)"
    return "the table does not record whether it is optional (it was created before tables recorded it): keep it"


def evolve(table: DeltaTable, spec: TableSpec, reopen: Callable[[], DeltaTable]) -> DeltaTable:
    """`table` with the config's new columns added, or SchemaChangeError. `reopen()` loads the table again: two
    writers adding the same column race, and the loser (its commit refused) checks again against what the
    winner committed."""
    lost: CommitFailedError | None = None
    for _ in range(3):
        problems, new = schema_problems(table, spec)
        if problems:
            raise SchemaChangeError(
                f"{spec.config_owner or 'config'}: table '{spec.name}' cannot take the config's schema: "
                + "; ".join(problems)
            )
        if not new:
            return table
        try:
            table.alter.add_columns(new)
        except CommitFailedError as exc:
            lost = exc
        table = reopen()
    raise RuntimeError(f"table '{spec.name}': adding columns kept losing to other writers") from lost


def with_stored_columns(table: DeltaTable, spec: TableSpec) -> TableSpec:
    """`spec` with the columns its table keeps that the config no longer names (dropped optional columns)
    appended: a job rewriting the table's files (an erasure) must carry their values over, not drop them."""
    names = set(spec.schema.names)
    kept = [f for f in pa.schema(table.schema().to_arrow()) if f.name not in names]
    return replace(spec, schema=pa.schema([*spec.schema, *kept])) if kept else spec
