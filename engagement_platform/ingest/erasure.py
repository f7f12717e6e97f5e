"""Erasure in the tables of pipelines whose records name people (a `suppression:` section): the rows a
pipeline stored before an erasure go with it. The erasure batch of the lake whose suppression list the
pipeline names adds these steps (no Spark, no Dagster):

- the target table: the files holding rows whose subject columns name an erased subject of their org /
  tenant are rewritten without them (lake/row_erasure.erase_rows: no id in the log);
- the quarantine table: the records whose raw content or parsed input names one are deleted by key.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from engagement_platform.ingest.config import PipelineConfig, load_pipelines
from engagement_platform.ingest.tables import quarantine_spec, target_spec
from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec
from engagement_platform.lake.row_erasure import delete_quarantined, erase_rows, live_files, quarantined_keys_naming
from engagement_platform.lake.schema_evolution import with_stored_columns
from engagement_platform.lake.suppression import Suppressed
from engagement_platform.streams.batch import CommitStep, Outcomes


def pipelines_naming_people(pipelines_dir: str | Path, list_table: str) -> list[PipelineConfig]:
    """The pipelines whose suppression section names `list_table` (one lake's list)."""
    return [
        c for c in load_pipelines(pipelines_dir) if c.suppression is not None and c.suppression.list_table == list_table
    ]


def naming_mask(rows: pa.Table, config: PipelineConfig, erased: Suppressed) -> pa.Array:
    """Which target rows name an erased subject of their org / tenant."""
    spec = config.suppression
    if spec is None:
        raise ValueError(f"pipeline {config.name} names no people (no suppression section)")
    scopes = rows[spec.scope_column].to_pylist() if spec.scope_column else [spec.scope] * rows.num_rows
    ids = [rows[c].to_pylist() for c in spec.subject_columns]
    return pa.array(
        [
            erased.hit(None if scope is None else str(scope), [None if v[i] is None else str(v[i]) for v in ids])
            is not None
            for i, scope in enumerate(scopes)
        ],
        pa.bool_(),
    )


def pipeline_erasure_steps(
    lake: DeltaLake, configs: list[PipelineConfig], erased: Suppressed, removed: dict[str, int]
) -> list[CommitStep]:
    """Two commit steps per pipeline (target, quarantine); `removed` gets the rows each one removed."""
    steps = []
    for config in configs:
        target, quarantine = target_spec(config), quarantine_spec(config)

        def erase_target(
            txn: BatchTxn, _: Outcomes, config: PipelineConfig = config, target: TableSpec = target
        ) -> int | None:
            if not erased:  # a batch without erasures reads nothing
                return None
            if lake.exists(target.name):  # columns a later config dropped keep their values in rewritten files
                target = with_stored_columns(lake.table(target.name), target)
            version, n = erase_rows(
                lake, target, live_files(lake, target), lambda rows: naming_mask(rows, config, erased), txn
            )
            removed[target.name] = removed.get(target.name, 0) + n
            return version

        def erase_quarantined(
            txn: BatchTxn, _: Outcomes, config: PipelineConfig = config, quarantine: TableSpec = quarantine
        ) -> int | None:
            if lake.exists(quarantine.name) and lake.already_committed(quarantine.name, txn):
                return None
            keys = quarantined_keys_naming(lake, quarantine, erased, ds.field("pipeline") == config.name)
            version, deleted = delete_quarantined(lake, quarantine, keys, txn)
            removed[quarantine.name] = removed.get(quarantine.name, 0) + deleted
            return version

        steps += [CommitStep(target.name, erase_target), CommitStep(quarantine.name, erase_quarantined)]
    return steps
