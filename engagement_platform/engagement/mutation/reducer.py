"""Where a batch's fold runs: each org's active requests reduced once, on the driver or as one Spark job
grouped by org (reduction/spark_reducer.py). Both give the same actions table, row for row; the choice
and its default are explained in the stream's module docstring (apply.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from engagement_platform.engagement.mutation.reduction.arrow import REDUCED_ARROW_SCHEMA, reduction_table
from engagement_platform.engagement.mutation.reduction.fold import reduce_requests
from engagement_platform.engagement.mutation.requests import MutationRequest
from engagement_platform.settings import load_settings

REDUCER_ENV = "EP_MUTATION_REDUCER"  # spark | driver | auto (apply.py's docstring: the default and why)
DEFAULT_REDUCER = "auto"
REDUCER = "driver"  # what a batch reports when no reduction ran


@dataclass
class BatchReduction:
    """Every org's reduced actions (reduction/arrow.py rows) and how many actions there are."""

    actions: pa.Table
    action_count: int
    reducer: str = REDUCER


def mutation_reducer(requests: int) -> str:
    """'spark' or 'driver' for a batch reducing `requests` requests (EP_MUTATION_REDUCER, EP_MUTATION_SPARK_THRESHOLD)."""
    settings = load_settings().mutation
    choice = settings.reducer
    if choice not in ("spark", "driver", "auto"):
        raise ValueError(f"{REDUCER_ENV}={choice!r}: expected spark, driver or auto")
    if choice == "auto":
        return "spark" if requests > settings.spark_threshold else "driver"
    return choice


def reduce_batch(requests: list[MutationRequest], order: np.ndarray, orgs: list[str], active: np.ndarray,
                 spark: SparkSession | None = None) -> BatchReduction:
    """Reduce each org's active requests once (`order`: fold order, `orgs`: each request's org):
    on Spark grouped by org (spark_reducer.reduce_to_arrow) or on the driver, per mutation_reducer."""
    applied = order[active[order]].tolist()
    if spark is not None and applied and mutation_reducer(len(applied)) == "spark":
        from engagement_platform.engagement.mutation.reduction.spark_reducer import reduce_to_arrow

        actions = reduce_to_arrow(spark, [requests[i] for i in applied])
        stats = actions.filter(pc.equal(actions["kind"], "stats"))
        count = sum(pc.sum(stats[name]).as_py() or 0 for name in ("owner_actions", "engagement_actions"))
        return BatchReduction(actions, count, reducer="spark")
    tables, count = [], 0
    for org, indices in groupby(applied, key=orgs.__getitem__):
        reduction = reduce_requests([requests[i] for i in indices])
        tables.append(reduction_table(org, reduction, with_external_targets=False))
        count += reduction.stats.actions_out
    actions = pa.concat_tables(tables) if tables else REDUCED_ARROW_SCHEMA.empty_table()
    return BatchReduction(actions, count)
