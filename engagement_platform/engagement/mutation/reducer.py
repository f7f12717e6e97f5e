"""The fold of a set of orgs: each org's active requests reduced once, in this process (a Spark task's
Python worker, rewrite_task.py). The result is reduction/arrow.py's flat action rows, org after org.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

import numpy as np
import pyarrow as pa

from engagement_platform.engagement.mutation.reduction.arrow import REDUCED_ARROW_SCHEMA, reduction_table
from engagement_platform.engagement.mutation.reduction.fold import reduce_requests
from engagement_platform.engagement.mutation.requests import MutationRequest


@dataclass
class BatchReduction:
    """Every org's reduced actions (reduction/arrow.py rows) and how many actions there are."""

    actions: pa.Table
    action_count: int


def reduce_batch(
    requests: list[MutationRequest], order: np.ndarray, orgs: list[str], active: np.ndarray
) -> BatchReduction:
    """Reduce each org's active requests once (`order`: fold order, `orgs`: each request's org)."""
    applied = order[active[order]].tolist()
    tables, count = [], 0
    for org, indices in groupby(applied, key=orgs.__getitem__):
        reduction = reduce_requests([requests[i] for i in indices])
        tables.append(reduction_table(org, reduction, with_external_targets=False))
        count += reduction.stats.actions_out
    actions = pa.concat_tables(tables) if tables else REDUCED_ARROW_SCHEMA.empty_table()
    return BatchReduction(actions, count)
