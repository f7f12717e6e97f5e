"""The batch lifecycle's commit phase, shared by every stream.

Each target table is committed in a fixed order, each commit carrying the Delta txn (app id, batch id)
with its rows. A re-run of the same plan skips every table whose txn version already covers the
batch, so a crash anywhere (between tables included) ends, after a retry, with each table holding the
batch exactly once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn
from engagement_platform.streams.planning import BatchPlan

# Fault injection for crash tests: "<stream>:after:<step>" makes the process die (as if killed)
# right after that step's commit. Unset in normal operation.
FAILPOINT_ENV = "EP_FAILPOINT"

Outcomes = dict[str, int | None]


@dataclass(frozen=True)
class CommitStep:
    """One table's commit: returns the table version written, or None if the batch was already there."""

    name: str
    commit: Callable[[BatchTxn, Outcomes], int | None]


def commit_batch(plan: BatchPlan, app_id: str, steps: list[CommitStep], checkpoints: CheckpointStore, **metadata) -> Outcomes:
    outcomes: Outcomes = {}
    for step in steps:
        txn = BatchTxn(app_id, plan.batch_id, {"stream": plan.stream, **metadata})
        version = step.commit(txn, outcomes)
        outcomes[step.name] = version
        checkpoints.record_state(plan, step.name, "committed" if version is not None else "already_committed", table_version=version)
        _failpoint(plan.stream, step.name)
    checkpoints.mark_done(plan, **{f"{k}_version": v for k, v in outcomes.items()})
    return outcomes


def _failpoint(stream: str, step: str) -> None:
    if os.environ.get(FAILPOINT_ENV) == f"{stream}:after:{step}":
        os._exit(137)  # no cleanup, no finally blocks: the closest thing to SIGKILL
