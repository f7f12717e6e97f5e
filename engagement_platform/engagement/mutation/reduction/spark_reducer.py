"""The cascade reduction on Spark: one group per org, each reduced by the pure fold (fold.py).

`groupBy("org_id").applyInArrow` hands every org's requests to a Python worker on the server (the
package is installed there), which runs `reduce_requests` and returns flat rows (arrow.py's
union schema, a `kind` column says which table a row belongs to). The grouped pass is checkpointed
once and split, so the fold never runs twice.

`reduce_to_arrow` is what the mutation stream calls (mutation/reducer.py, EP_MUTATION_REDUCER=spark|auto):
the driver's checked requests go up as one Arrow relation, one grouped job reduces every org, and
the union rows come back as one Arrow table, in the same per-org order as the driver's fold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from engagement_platform.engagement.mutation.reduction.fold import reduce_requests
from engagement_platform.engagement.mutation.reduction.model import ReductionStats
from engagement_platform.engagement.mutation.requests import MutationRequest
from engagement_platform.engagement.mutation.reduction.arrow import (
    ENGAGEMENT_ACTION_COLUMNS, EXTERNAL_TARGET_COLUMNS, OWNER_ACTION_COLUMNS, REDUCED_ARROW_SCHEMA, REDUCED_SCHEMA, STAT_COLUMNS,
    record_to_json, reduction_table, requests_from_arrow,
)

REQUEST_SCHEMA = (
    "request_id string, org_id string, request_time timestamp, op string, field string, owner_id string, "
    "from_ids array<string>, to_field string, to_id string, engagement_id string, record string, date_from date, date_to date"
)


@dataclass(frozen=True, slots=True)
class SparkReductionStats(ReductionStats):
    orgs: int = 0
    external_targets: int = 0  # counted even when their rows are left out


@dataclass(frozen=True)
class ReducedFrames:
    owner_actions: DataFrame
    engagement_actions: DataFrame
    external_targets: DataFrame  # what the batch expects to exist already (for pending requests)
    stats: SparkReductionStats


def reduce_on_spark(requests_df: DataFrame, partitions: int | None = None) -> tuple[DataFrame, DataFrame, SparkReductionStats]:
    """(owner actions, engagement actions, stats) of every org's batch in `requests_df` (REQUEST_SCHEMA)."""
    frames = reduce_on_spark_frames(requests_df, with_external_targets=False, partitions=partitions)
    return frames.owner_actions, frames.engagement_actions, frames.stats


def reduce_on_spark_frames(requests_df: DataFrame, with_external_targets: bool = True, partitions: int | None = None) -> ReducedFrames:
    """All outputs; without external targets the union is about half as many rows for a typical batch.

    The requests are repartitioned by org into `partitions` (default: spark.sql.shuffle.partitions)
    explicitly: a batch is small in bytes, so adaptive execution would otherwise coalesce the
    grouping shuffle into one partition and run every org's fold on one core.
    """
    if partitions is None:
        partitions = int(requests_df.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    reduce_org = reduce_org_table if with_external_targets else reduce_org_table_without_targets
    by_org = requests_df.repartition(partitions, "org_id")
    reduced = by_org.groupBy("org_id").applyInArrow(reduce_org, schema=REDUCED_SCHEMA).localCheckpoint()
    totals = reduced.filter(F.col("kind") == "stats").agg(
        F.count(F.lit(1)).alias("orgs"), *(F.coalesce(F.sum(name), F.lit(0)).alias(name) for name in STAT_COLUMNS)
    ).first()
    stats = SparkReductionStats(**{name: int(totals[name]) for name in ("orgs", *STAT_COLUMNS)})

    def part(kind: str, columns: tuple[str, ...]) -> DataFrame:
        return reduced.filter(F.col("kind") == kind).select(*columns)

    return ReducedFrames(
        owner_actions=part("owner", OWNER_ACTION_COLUMNS),
        engagement_actions=part("engagement", ENGAGEMENT_ACTION_COLUMNS),
        external_targets=part("external", EXTERNAL_TARGET_COLUMNS),
        stats=stats,
    )


REQUEST_ARROW_SCHEMA = pa.schema([
    ("request_id", pa.string()), ("org_id", pa.string()), ("request_time", pa.timestamp("us", tz="UTC")), ("op", pa.string()),
    ("field", pa.string()), ("owner_id", pa.string()), ("from_ids", pa.list_(pa.string())), ("to_field", pa.string()),
    ("to_id", pa.string()), ("engagement_id", pa.string()), ("record", pa.string()), ("date_from", pa.date32()),
    ("date_to", pa.date32()),
])


def requests_to_arrow(requests: Iterable[MutationRequest]) -> pa.Table:
    """Requests (request_time a datetime) as REQUEST_SCHEMA rows, column by column; records as JSON."""
    requests = list(requests)
    columns = {
        "request_id": [r.request_id for r in requests], "org_id": [r.org_id for r in requests],
        "request_time": [r.request_time for r in requests], "op": [r.op for r in requests],
        "field": [r.field for r in requests], "owner_id": [r.owner_id for r in requests],
        "from_ids": [list(r.from_ids) if r.from_ids else None for r in requests],
        "to_field": [r.to_field for r in requests], "to_id": [r.to_id for r in requests],
        "engagement_id": [r.engagement_id for r in requests],
        "record": [None if r.record is None else record_to_json(r.record) for r in requests],
        "date_from": [r.date_from for r in requests], "date_to": [r.date_to for r in requests],
    }
    return pa.Table.from_pydict(columns, schema=REQUEST_ARROW_SCHEMA)


def reduce_to_arrow(spark: SparkSession, requests: Iterable[MutationRequest], partitions: int | None = None) -> pa.Table:
    """Every org's owner, engagement and stats rows (REDUCED_ARROW_SCHEMA, no external targets) from one
    grouped Spark job, collected to the driver: the table the driver's fold builds, in its order
    (orgs sorted, each org's rows as reduction_table emits them)."""
    table = requests_to_arrow(requests)
    if table.num_rows == 0:
        return REDUCED_ARROW_SCHEMA.empty_table()
    if partitions is None:
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    by_org = spark.createDataFrame(table).repartition(partitions, "org_id")
    reduced = by_org.groupBy("org_id").applyInArrow(reduce_org_table_without_targets, schema=REDUCED_SCHEMA).toArrow()
    reduced = reduced.select(REDUCED_ARROW_SCHEMA.names).cast(REDUCED_ARROW_SCHEMA)
    # Arrow's sort is stable: an org's rows keep the order its worker emitted them in.
    return reduced.take(pc.sort_indices(reduced, [("org_id", "ascending")]))


# ---------------------------------------------------------------- what runs in the Python worker


def reduce_org_table(table: pa.Table) -> pa.Table:
    """One org's requests (REQUEST_SCHEMA as Arrow) -> its union rows (REDUCED_ARROW_SCHEMA)."""
    return _reduce_org(table, with_external_targets=True)


def reduce_org_table_without_targets(table: pa.Table) -> pa.Table:
    # A separate one-argument function: applyInArrow passes the group key to two-argument ones.
    return _reduce_org(table, with_external_targets=False)


def _reduce_org(table: pa.Table, with_external_targets: bool) -> pa.Table:
    requests = requests_from_arrow(table)
    org_id = requests[0].org_id if requests else None
    return reduction_table(org_id, reduce_requests(requests), with_external_targets)
