"""The batch lifecycle's commit phase, shared by every stream.

Each target table is committed in a fixed order, each commit carrying the Delta txn (app id, batch id)
with its rows. A re-run of the same plan skips every table whose txn version already covers the
batch, so a crash anywhere (between tables included) ends, after a retry, with each table holding the
batch exactly once. Once every table is committed, the checkpoint store gets each table's outcome and
the batch's "done" row in one commit.

`commit_batches` does this for several batches at once (the profile processor: a batch per tenant):
step i of every batch runs before step i+1 of any. A `CommitStep` writes the batch's own table, so
those of different batches run in parallel threads; an `AppendStep` names a table every batch appends
to, and their rows go in one commit carrying every batch's txn; a `FilesStep` does the same with files the
batches wrote (adds and removes). A batch whose step fails takes no
further step; the others finish, then the first error is raised. `commit_batch` is the one-batch case.

Fencing: inside `with fenced(lease):` (the stream holds the coordinator's lock), `lease.check()` runs
right before each commit, so a writer whose ZooKeeper session was lost raises LeaseLost instead of
committing, and the lease's fencing token, lock name and owner go into each commit's metadata (Delta
history shows which lock holder wrote what). Without an active lease (coordinator off, CLI runs)
commits are unfenced. The check narrows the window to the commit itself: a session that expires
during one table's write cannot stop that write.

Fault points: with EP_FAILPOINT="<stream>:after:<step>" the process dies (as if killed) right after
that step's commit: the crash tests' way to stop a batch between two tables. With EP_PAUSEPOINT set the
same way the run stops there for good instead (creating the file EP_PAUSEPOINT_MARKER names; once that file
exists, later runs pass the point), so a test can kill the host or the run at a known point of the batch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar, copy_context
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from engagement_platform.lake.checkpoints import CheckpointStore, Outcomes
from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec
from engagement_platform.lake.file_writes import WrittenFile, commit_files_of_batches
from engagement_platform.streams.planning import BatchPlan

if TYPE_CHECKING:
    from engagement_platform.streams.coordinator import Lease

FAILPOINT_ENV = "EP_FAILPOINT"  # unset in normal operation
PAUSEPOINT_ENV, PAUSEPOINT_MARKER_ENV = "EP_PAUSEPOINT", "EP_PAUSEPOINT_MARKER"  # unset in normal operation

_LEASE: ContextVar[Lease | None] = ContextVar("engagement_platform_lease", default=None)


@contextmanager
def fenced(lease: Lease | None) -> Iterator[Lease | None]:
    """Commits made by `commit_batch(es)` inside this block are fenced by `lease` (None: unfenced)."""
    token = _LEASE.set(lease)
    try:
        yield lease
    finally:
        _LEASE.reset(token)


class AllLeases:
    """Several held locks fencing one batch's commits (a batch that writes tables of several lock owners,
    e.g. an erasure across tenants): checked together before each commit, all named in its metadata."""

    def __init__(self, leases: list[Lease], table_locks: frozenset[str] = frozenset()):
        self.leases = leases
        # Locks each named after the one table they guard (a tenant's raw table): a commit of one of those tables
        # is fenced by its own lock and the others' (not every table lock of a run of many tenants).
        self.table_locks = table_locks
        self.token = ",".join(str(lease.token) for lease in leases)
        self.lock_name = ",".join(lease.lock_name for lease in leases)
        self.owner = ",".join(sorted({lease.owner for lease in leases}))
        self.waited_s = sum(lease.waited_s for lease in leases)  # each lock's wait (set by wait_for_lock)

    def for_table(self, table: str) -> AllLeases:
        """The leases fencing a commit of `table` alone: without the other tables' own locks."""
        if table not in self.table_locks:
            return self
        return AllLeases(
            [lease for lease in self.leases if lease.lock_name == table or lease.lock_name not in self.table_locks]
        )

    def check(self) -> None:
        """Every lease holds: one round trip per ZooKeeper session, not one per lease."""
        by_session: dict[int, list[Lease]] = {}
        for lease in self.leases:
            by_session.setdefault(id(lease.coordinator), []).append(lease)
        for leases in by_session.values():
            leases[0].coordinator.check_leases(leases)


def active_lease() -> Lease | None:
    return _LEASE.get()


def _fence(lease: Lease | None) -> dict:
    """Check the lease right before a commit (LeaseLost: this writer must not commit); the metadata naming it."""
    if lease is None:
        return {}
    lease.check()
    return {"fencing_token": lease.token, "lock_name": lease.lock_name, "lock_owner": lease.owner}


def failpoint(stream: str, step: str) -> None:
    """Die here, as if killed, when EP_FAILPOINT names this stream and step; stop here for good when
    EP_PAUSEPOINT does, unless the file EP_PAUSEPOINT_MARKER names exists already: a run paused there once, and
    the retry of the killed run goes on (crash tests)."""
    point = f"{stream}:after:{step}"
    if os.environ.get(FAILPOINT_ENV) == point:
        os._exit(137)  # no cleanup, no finally blocks: the closest thing to SIGKILL
    if os.environ.get(PAUSEPOINT_ENV) == point:
        marker = os.environ.get(PAUSEPOINT_MARKER_ENV)
        if marker:
            if os.path.exists(marker):
                return  # paused once already: the retry of the killed run goes on
            open(marker, "a").close()
        while True:  # until the test kills the host
            time.sleep(3600)


@dataclass(frozen=True)
class CommitStep:
    """One table's commit: returns the table version written, or None if the batch was already there."""

    name: str
    commit: Callable[[BatchTxn, Outcomes], int | None]
    phase: str = ""  # commit_batches times its steps by phase (default: the name)


@dataclass(frozen=True)
class AppendStep:
    """Rows this batch appends to a table that other batches of the same commit_batches call append to
    too: all of them in one commit with every batch's txn (None: the batch's rows were already there)."""

    lake: DeltaLake
    spec: TableSpec
    rows: Callable[[Outcomes], list[dict]]  # the batch's rows, given its outcomes so far
    phase: str = ""

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class FilesStep:
    """Files this batch adds to and removes from a table that other batches of the same commit_batches call
    write too (written where the rows were, lake/file_writes): all of them in one commit with every batch's
    txn (None: the batch was already there)."""

    lake: DeltaLake
    spec: TableSpec
    files: Callable[
        [Outcomes], tuple[list[WrittenFile], list[WrittenFile]]
    ]  # (adds, removes), given its outcomes so far
    phase: str = ""

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class Batch:
    """One plan's commit: its app id, its steps and the metadata each of its commits carries."""

    plan: BatchPlan
    app_id: str
    steps: Sequence[CommitStep | AppendStep | FilesStep]
    metadata: dict = field(default_factory=dict)
    outcomes: Outcomes = field(default_factory=dict)  # filled in step by step

    def txn(self, fence: dict | None = None) -> BatchTxn:
        return BatchTxn(self.app_id, self.plan.batch_id, {"stream": self.plan.stream, **self.metadata, **(fence or {})})


@dataclass(frozen=True)
class Committed:
    outcomes: list[Outcomes]  # per batch, in the order given
    seconds: dict[str, float]  # per step phase, and "checkpoints"


def commit_batch(
    plan: BatchPlan, app_id: str, steps: list[CommitStep], checkpoints: CheckpointStore, **metadata: Any
) -> Outcomes:
    """Commit one batch's steps in order, then its checkpoint states (commit_batches for one batch)."""
    return commit_batches([Batch(plan, app_id, steps, metadata)], checkpoints).outcomes[0]


def commit_batches(batches: list[Batch], checkpoints: CheckpointStore, threads: int = 1, **metadata: Any) -> Committed:
    """Every batch's steps, position by position (all batches have as many steps), then the states of
    every finished batch in one checkpoint commit carrying `metadata`. CommitSteps of one position run
    in up to `threads` threads, so they must write different tables."""
    if len({len(b.steps) for b in batches}) > 1:
        raise ValueError("every batch of commit_batches needs the same number of steps")
    lease = _LEASE.get()
    failed: dict[int, BaseException] = {}
    seconds: dict[str, float] = {}
    for position in range(len(batches[0].steps) if batches else 0):
        started = time.perf_counter()
        live = [i for i in range(len(batches)) if i not in failed]
        own = [i for i in live if isinstance(batches[i].steps[position], CommitStep)]
        shared: dict[str, list[int]] = {}
        for i in live:
            if isinstance(batches[i].steps[position], (AppendStep, FilesStep)):
                shared.setdefault(batches[i].steps[position].name, []).append(i)
        _run_own_steps([batches[i] for i in own], own, position, lease, threads, failed)
        for indexes in shared.values():
            _run_append_step([batches[i] for i in indexes], indexes, position, lease, failed, metadata)
        step = batches[live[0]].steps[position] if live else batches[0].steps[position]
        phase = step.phase or step.name
        seconds[phase] = seconds.get(phase, 0.0) + time.perf_counter() - started
    started = time.perf_counter()
    checkpoints.finish_batches([(b.plan, b.outcomes) for i, b in enumerate(batches) if i not in failed], **metadata)
    seconds["checkpoints"] = time.perf_counter() - started
    if failed:
        raise failed[min(failed)]
    return Committed([b.outcomes for b in batches], seconds)


_S = TypeVar("_S", CommitStep, AppendStep, FilesStep)


def _step(batch: Batch, position: int, kind: type[_S]) -> _S:
    """The batch's step at `position`, which commit_batches grouped by its kind."""
    step = batch.steps[position]
    if not isinstance(step, kind):
        raise TypeError(
            f"step {position} of {batch.plan.stream} batch {batch.plan.batch_id} is a {type(step).__name__}"
        )
    return step


def _run_own_steps(
    batches: list[Batch],
    indexes: list[int],
    position: int,
    lease: Lease | None,
    threads: int,
    failed: dict[int, BaseException],
) -> None:
    def run(batch: Batch) -> None:
        step = _step(batch, position, CommitStep)
        own = lease.for_table(step.name) if isinstance(lease, AllLeases) else lease  # the step writes one table
        batch.outcomes[step.name] = step.commit(batch.txn(_fence(own)), batch.outcomes)
        failpoint(batch.plan.stream, step.name)

    if len(batches) <= 1 or threads <= 1:
        for i, batch in zip(indexes, batches):
            try:
                run(batch)
            except Exception as exc:  # the other batches still finish
                failed[i] = exc
        return
    with ThreadPoolExecutor(min(threads, len(batches))) as pool:
        futures = [
            (i, pool.submit(copy_context().run, run, batch)) for i, batch in zip(indexes, batches)
        ]  # steps see the caller's context
        for i, future in futures:
            try:
                future.result()
            except Exception as exc:
                failed[i] = exc


def _run_append_step(
    batches: list[Batch],
    indexes: list[int],
    position: int,
    lease: Lease | None,
    failed: dict[int, BaseException],
    metadata: dict,
) -> None:
    """One commit of every batch's rows (each row with its batch's txn), then each batch's failpoint."""
    first = batches[0].steps[position]
    step = first if isinstance(first, FilesStep) else _step(batches[0], position, AppendStep)
    try:
        if isinstance(step, FilesStep):
            parts = [(batch.txn(), *_step(batch, position, FilesStep).files(batch.outcomes)) for batch in batches]
            counts = [1] * len(batches)  # one "row" per batch: written or not
            version, written = commit_files_of_batches(step.lake, step.spec, parts, {**metadata, **_fence(lease)})
        else:
            rows = [
                [(batch.txn(), row) for row in _step(batch, position, AppendStep).rows(batch.outcomes)]
                for batch in batches
            ]
            counts = [len(batch_rows) for batch_rows in rows]
            version, written = step.lake.append_many(
                step.spec, [r for batch_rows in rows for r in batch_rows], {**metadata, **_fence(lease)}
            )
    except Exception as exc:  # the batches of the other steps still finish
        for i in indexes:
            failed[i] = exc
        return
    for batch, count in zip(batches, counts):
        mine, written = written[:count], written[count:]
        batch.outcomes[step.name] = version if any(mine) else None
    for batch in batches:
        failpoint(batch.plan.stream, step.name)
