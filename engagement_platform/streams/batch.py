"""The batch lifecycle's commit phase, shared by every stream.

Each target table is committed in a fixed order, each commit carrying the Delta txn (app id, batch id)
with its rows. A re-run of the same plan skips every table whose txn version already covers the
batch, so a crash anywhere (between tables included) ends, after a retry, with each table holding the
batch exactly once.

Fencing: inside `with fenced(lease):` (the stream holds the coordinator's lock), `commit_batch` calls
`lease.check()` right before each table's commit, so a writer whose ZooKeeper session was lost
raises LeaseLost instead of committing, and writes the lease's fencing token, lock name and owner
into each commit's metadata (Delta history shows which lock holder wrote what). Without an active
lease (coordinator off, CLI runs) commits are unfenced, as before. The check narrows the window
to the commit itself: a session that expires during one table's write cannot stop that write.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn
from engagement_platform.streams.planning import BatchPlan

if TYPE_CHECKING:
    from engagement_platform.streams.coordinator import Lease

# Fault injection for crash tests: "<stream>:after:<step>" makes the process die (as if killed)
# right after that step's commit. Unset in normal operation.
FAILPOINT_ENV = "EP_FAILPOINT"

Outcomes = dict[str, int | None]

_LEASE: ContextVar[Lease | None] = ContextVar("engagement_platform_lease", default=None)


@contextmanager
def fenced(lease: Lease | None) -> Iterator[Lease | None]:
    """Commits made by `commit_batch` inside this block are fenced by `lease` (None: unfenced)."""
    token = _LEASE.set(lease)
    try:
        yield lease
    finally:
        _LEASE.reset(token)


def active_lease() -> Lease | None:
    return _LEASE.get()


@dataclass(frozen=True)
class CommitStep:
    """One table's commit: returns the table version written, or None if the batch was already there."""

    name: str
    commit: Callable[[BatchTxn, Outcomes], int | None]


def commit_batch(plan: BatchPlan, app_id: str, steps: list[CommitStep], checkpoints: CheckpointStore, **metadata) -> Outcomes:
    outcomes: Outcomes = {}
    lease = _LEASE.get()
    for step in steps:
        fence = {}
        if lease is not None:
            lease.check()  # raises LeaseLost: this writer must not commit
            fence = {"fencing_token": lease.token, "lock_name": lease.lock_name, "lock_owner": lease.owner}
        txn = BatchTxn(app_id, plan.batch_id, {"stream": plan.stream, **metadata, **fence})
        version = step.commit(txn, outcomes)
        outcomes[step.name] = version
        checkpoints.record_state(plan, step.name, "committed" if version is not None else "already_committed", table_version=version)
        _failpoint(plan.stream, step.name)
    checkpoints.mark_done(plan, **{f"{k}_version": v for k, v in outcomes.items()})
    return outcomes


def _failpoint(stream: str, step: str) -> None:
    if os.environ.get(FAILPOINT_ENV) == f"{stream}:after:{step}":
        os._exit(137)  # no cleanup, no finally blocks: the closest thing to SIGKILL
