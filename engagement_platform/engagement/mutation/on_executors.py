"""The driver's side of the mutation batch's Spark job: send the checked requests to the executors,
partitioned by org, with the plan of which files each org reads (affected_rows.plan_files), and gather
what the tasks hand back (rewrite_task.py) into what the commits need.

The driver never receives table rows, only file actions, row-level changes (what the change log
stores), held-back requests and counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from engagement_platform.engagement.mutation.affected_rows import FilePlan
from engagement_platform.engagement.mutation.hold_back import HoldBack
from engagement_platform.engagement.mutation.org_outcome import CANDIDATE, CHANGE_TYPE
from engagement_platform.engagement.mutation.request_columns import CANONICAL_SCHEMA
from engagement_platform.engagement.mutation.rewrite_task import ADDS, CHANGES, HELD, REMOVES, STAT_NAMES, STATS, rewrite_task
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.file_writes import WrittenFile
from engagement_platform.spark.handoff import HANDOFF_SCHEMA, collect_handoff

CHANGES_SCHEMA = ENGAGEMENT_ACTIVITY.schema.append(pa.field(CHANGE_TYPE, pa.string()))
CHANGE_COUNTS = {"update_postimage": "updated", "delete": "deleted"}


@dataclass
class ExecutorResult:
    held_back: HoldBack  # over the candidate table's rows, as hold_back.hold_back gives it
    stats: dict[str, int]  # rewrite_task.STAT_NAMES summed over the tasks
    adds: list[WrittenFile]
    removes: list[WrittenFile]
    changes: pa.Table  # CHANGES_SCHEMA: pre/post-images and deletes of the batch

    def change_counts(self) -> dict[str, dict[str, int]]:
        """org -> {inserted, updated, deleted}: what the notification rows say about the batch's commit."""
        counts: dict[str, dict[str, int]] = {}
        grouped = self.changes.group_by(["org_id", CHANGE_TYPE]).aggregate([([], "count_all")]).to_pylist()
        for row in grouped:
            kind = CHANGE_COUNTS.get(row[CHANGE_TYPE])
            if kind:
                counts.setdefault(row["org_id"], {"inserted": 0, "updated": 0, "deleted": 0})[kind] += row["count_all"]
        return counts


def apply_on_executors(spark: SparkSession, lake: DeltaLake, candidates: pa.Table, files: FilePlan, tag: str, write: bool) -> ExecutorResult:
    """One Spark job over the candidate requests (CANDIDATE_SCHEMA rows), partitioned by org: each task
    applies its orgs' requests to their planned files (writing new files when `write`)."""
    n = candidates.num_rows
    requests = candidates.select(CANONICAL_SCHEMA.names).append_column(CANDIDATE, pa.array(np.arange(n, dtype=np.int64)))
    handed: dict[str, pa.Table] = {}
    if n:
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
        task = rewrite_task(lake.uri(ENGAGEMENT_ACTIVITY.name), files.files_by_org, tag, write, lake.storage_options)
        frame = spark.createDataFrame(requests).repartition(partitions, "org_id")
        handed = collect_handoff(frame.mapInArrow(task, HANDOFF_SCHEMA))
    active = np.ones(n, dtype=bool)
    held, missing = [], {}
    if HELD in handed:
        held = handed[HELD]["candidate"].to_pylist()
        missing = {c: json.loads(text) for c, text in zip(held, handed[HELD]["missing"].to_pylist())}
        active[held] = False
    stats = {k: int(pc.sum(handed[STATS][k]).as_py() or 0) if STATS in handed else 0 for k in STAT_NAMES}
    changes = handed[CHANGES].cast(CHANGES_SCHEMA) if CHANGES in handed else CHANGES_SCHEMA.empty_table()
    return ExecutorResult(
        held_back=HoldBack(active, held, missing, 0),
        stats=stats,
        adds=_files(handed.get(ADDS)),
        removes=_files(handed.get(REMOVES)),
        changes=changes,
    )


def _files(table: pa.Table | None) -> list[WrittenFile]:
    return [WrittenFile.from_json(text) for text in table["file"].to_pylist()] if table is not None else []
