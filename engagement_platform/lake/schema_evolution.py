"""A table whose columns come from a pipeline's config, brought to the config's schema when a writer opens it.

What users of DLT, Hudi and Iceberg sinks expect: a config that gains a column keeps writing to its table (the
column is added, nullable: rows written before read null); a change that would rewrite or reinterpret what the
table holds is refused before anything is written, naming the pipeline, the column and the table. A column the
config no longer names is refused too: the table cannot tell a required column from an optional one, and new rows
would silently lack it (keep it in the config). The platform's own
tables are not checked here: their schemas change with the code (docs/operations/upgrade.md). Only the pipeline's own
writer evolves its table (DeltaLake.ensure_config_schema, before it computes a batch): an erasure or an upkeep
job rewriting the table's files takes the table as it is, so a config change never blocks an erasure."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from deltalake import DeltaTable, Field, Schema
from deltalake.exceptions import CommitFailedError

if TYPE_CHECKING:
    from engagement_platform.lake.delta import TableSpec


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
        f"column '{name}' is in the table but not in the config (a column cannot be removed: keep it)"
        for name in current
        if name not in named
    ]
    problems += [
        f"column '{f.name}' is {_type_name(current[f.name].type)} in the table and {_type_name(f.type)} in the config"
        for f in wanted
        if f.name in current and current[f.name].type != f.type
    ]
    partitioned = tuple(table.metadata().partition_columns)
    if partitioned != tuple(spec.partition_by):
        problems.append(f"the table is partitioned by {list(partitioned)}, the config says {list(spec.partition_by)}")
    return problems, [Field(f.name, f.type, nullable=True) for f in wanted if f.name not in current]


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
