"""The driver's side of the mutation batch's Spark job: send the checked requests to the executors,
partitioned by org, with the plan of which files each org reads (affected_rows.plan_files), and gather
what the tasks hand back (rewrite_task.py) into what the commits need.

The driver also plans which task takes which orgs (task_of_org: balanced by planned bytes and requests)
and hands each task its requests and its orgs' planned files as Arrow files in a per-run folder under
the lake (spark/handoff_files.py), read by the task itself: neither passes through the Spark plan, the
JVM's row conversions or a shuffle, and a task holds only its own orgs' plan.

The driver never receives table rows, only file actions (of the table and of its change log),
held-back requests and counts.
"""

from __future__ import annotations

import heapq
import json
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from engagement_platform.engagement.mutation.affected_rows import FilePlan
from engagement_platform.engagement.mutation.hold_back import HoldBack
from engagement_platform.engagement.mutation.org_outcome import CANDIDATE
from engagement_platform.engagement.mutation.request_columns import CANONICAL_SCHEMA
from engagement_platform.engagement.mutation.rewrite_task import (
    ADDS,
    COUNTS,
    HELD,
    LOG_ADDS,
    REMOVES,
    STAT_NAMES,
    STATS,
    rewrite_task,
)
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_ACTIVITY_CHANGES
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.file_writes import WrittenFile
from engagement_platform.spark.handoff import HANDOFF_SCHEMA, collect_handoff
from engagement_platform.spark.handoff_files import (
    delete_handoff,
    handoff_parent,
    new_handoff,
    sweep_handoffs,
    write_handoff,
)

HANDOFF_MAX_AGE = timedelta(hours=24)  # a handoff folder older than this was left by a crashed run


@dataclass
class ExecutorResult:
    held_back: HoldBack  # over the candidate table's rows, as hold_back.hold_back gives it
    stats: dict[str, int]  # rewrite_task.STAT_NAMES summed over the tasks
    adds: list[WrittenFile]
    removes: list[WrittenFile]
    log_adds: list[WrittenFile]  # the change log's files: pre/post-images and deletes of the batch
    counts: pa.Table  # org_id, updated, deleted (one row per org and task chunk)

    def change_counts(self) -> dict[str, dict[str, int]]:
        """org -> {inserted, updated, deleted}: what the notification rows say about the batch's commit."""
        counts: dict[str, dict[str, int]] = {}
        for row in self.counts.group_by("org_id").aggregate([("updated", "sum"), ("deleted", "sum")]).to_pylist():
            if row["updated_sum"] or row["deleted_sum"]:
                counts[row["org_id"]] = {"inserted": 0, "updated": row["updated_sum"], "deleted": row["deleted_sum"]}
        return counts


def apply_on_executors(
    spark: SparkSession,
    lake: DeltaLake,
    candidates: pa.Table,
    files: FilePlan,
    tag: str,
    write: bool,
    log_version: int | None,
    seconds: dict[str, float],
) -> ExecutorResult:
    """One Spark job over the candidate requests (CANDIDATE_SCHEMA rows), partitioned by org: each task
    applies its orgs' requests to their planned files (rewrite_task: new data files when `write`, change
    log files stamped `log_version` unless None). The upload's and the job's seconds go into `seconds`."""
    n = candidates.num_rows
    requests = candidates.select(CANONICAL_SCHEMA.names).append_column(
        CANDIDATE, pa.array(np.arange(n, dtype=np.int64))
    )
    handed: dict[str, pa.Table] = {}
    if n:
        tasks = int(spark.conf.get("spark.sql.shuffle.partitions"))
        t = time.perf_counter()
        parent, now = handoff_parent(lake.root, "mutation"), datetime.now(UTC)
        sweep_handoffs(parent, now, HANDOFF_MAX_AGE, lake.storage_options)
        folder = new_handoff(parent, now, uuid.uuid4().hex)
        task_of = task_of_org(requests, files, tasks)
        bucket = pa.array([task_of[o] for o in requests["org_id"].to_pylist()], pa.int64())
        for index in range(tasks):
            write_handoff(
                f"{folder}/requests-{index}.arrow", requests.filter(pc.equal(bucket, index)), lake.storage_options
            )
            planned = [
                f.to_json()
                for org, index_of in task_of.items()
                if index_of == index
                for f in files.files_by_org.get(org, ())
            ]
            write_handoff(
                f"{folder}/files-{index}.arrow",
                pa.table({"file": pa.array(planned, pa.string())}),
                lake.storage_options,
            )
        seconds["upload"] = time.perf_counter() - t
        try:
            task = rewrite_task(
                lake.uri(ENGAGEMENT_ACTIVITY.name),
                lake.uri(ENGAGEMENT_ACTIVITY_CHANGES.name),
                tag,
                write,
                log_version,
                folder,
                lake.storage_options,
            )
            handed = collect_handoff(spark.range(tasks, numPartitions=tasks).mapInArrow(task, HANDOFF_SCHEMA))
        finally:
            delete_handoff(folder, lake.storage_options)
        seconds["job"] = time.perf_counter() - t - seconds["upload"]
    active = np.ones(n, dtype=bool)
    held, missing = [], {}
    if HELD in handed:
        held = handed[HELD]["candidate"].to_pylist()
        missing = {c: json.loads(text) for c, text in zip(held, handed[HELD]["missing"].to_pylist())}
        active[held] = False
    stats = {k: int(pc.sum(handed[STATS][k]).as_py() or 0) if STATS in handed else 0 for k in STAT_NAMES}
    return ExecutorResult(
        held_back=HoldBack(active, held, missing, 0),
        stats=stats,
        adds=_files(handed.get(ADDS)),
        removes=_files(handed.get(REMOVES)),
        log_adds=_files(handed.get(LOG_ADDS)),
        counts=handed.get(COUNTS, COUNTS_SCHEMA.empty_table()),
    )


COUNTS_SCHEMA = pa.schema([("org_id", pa.string()), ("updated", pa.int64()), ("deleted", pa.int64())])


def task_of_org(requests: pa.Table, files: FilePlan, tasks: int) -> dict[str, int]:
    """Org -> task index, so that every task gets about the same work: each org weighs its share of the
    planned bytes plus its share of the requests; the heaviest orgs are placed first, each on the least
    loaded task (an org is never split: the rules are per org)."""
    per_org = requests.group_by("org_id").aggregate([([], "count_all")])
    count = dict(zip(per_org["org_id"].to_pylist(), per_org["count_all"].to_pylist()))
    size = {org: sum(f.size for f in files.files_by_org.get(org, ())) for org in count}
    total_size, total_count = max(sum(size.values()), 1), max(sum(count.values()), 1)
    weight = {org: size[org] / total_size + count[org] / total_count for org in count}
    loads = [(0.0, index) for index in range(max(tasks, 1))]
    heapq.heapify(loads)
    placed = {}
    for org in sorted(weight, key=lambda o: (-weight[o], o)):
        load, index = heapq.heappop(loads)
        placed[org] = index
        heapq.heappush(loads, (load + weight[org], index))
    return placed


def _files(table: pa.Table | None) -> list[WrittenFile]:
    return [WrittenFile.from_json(text) for text in table["file"].to_pylist()] if table is not None else []
