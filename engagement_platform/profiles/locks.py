"""The tenant lock: processor and backfill runs of one tenant write its raw table one at a time.

Both MERGE the whole table (it is not partitioned), so two writers at once make delta-rs refuse one
commit ("a concurrent transaction added new data"). Each run takes the ZooKeeper lock
`profile_raw/<tenant>` (the raw table's name) before it reads the table and commits inside
`fenced(lease)`, so commit_batch checks the lease right before each commit and writes the fencing
token into the commit's metadata. No predecessor rule: backfill and processor may follow each other
in any order. The staging dumper takes no lock (appends never conflict).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from engagement_platform.profiles.tables import raw_table_name
from engagement_platform.streams.batch import AllLeases, active_lease, fenced
from engagement_platform.streams.coordinator import Coordinator, Lease, LockBusy

LOCK_TIMEOUT_S = 30.0


def tenant_lock_name(tenant: str) -> str:
    return raw_table_name(tenant)  # "profile_raw/<tenant>": validated, so a safe znode path


@contextmanager
def tenant_lock(
    coordinator: Coordinator | None,
    tenant: str,
    owner: str,
    timeout_s: float = LOCK_TIMEOUT_S,
    patience_s: float | None = None,
    on_wait: Callable[[LockBusy, float], None] | None = None,
) -> Iterator[Lease | None]:
    """Hold the tenant's lock for the block, commits fenced by it; `coordinator` None = no lock
    (EP_COORDINATOR=off). While another run holds it, waits in rounds of `timeout_s` up to `patience_s`
    in all (Coordinator.wait_for_lock: `on_wait` after each round; the lease's `waited_s` says how long),
    then raises LockBusy (a CoordinationGaveUp)."""
    if coordinator is None:
        with fenced(None):
            yield None
        return
    lease = coordinator.wait_for_lock(tenant_lock_name(tenant), owner, timeout_s, patience_s, on_wait)
    try:
        with fenced(lease):
            yield lease
    finally:
        coordinator.unlock(lease)


@contextmanager
def tenant_locks(
    coordinator: Coordinator | None,
    tenants: list[str],
    owner: str,
    timeout_s: float = LOCK_TIMEOUT_S,
    patience_s: float | None = None,
    on_wait: Callable[[LockBusy, float], None] | None = None,
) -> Iterator[AllLeases | None]:
    """Hold several tenants' locks for the block (taken in sorted order, so two such runs cannot deadlock),
    commits fenced by all of them and by the lock the run already holds; `coordinator` None = no locks. Each
    lock is waited for as tenant_lock waits; the yielded fence's `waited_s` is the sum of the waits."""
    if coordinator is None:
        yield None
        return
    held: list[Lease] = []
    try:
        for tenant in sorted(set(tenants)):
            held.append(coordinator.wait_for_lock(tenant_lock_name(tenant), owner, timeout_s, patience_s, on_wait))
        outer = active_lease()
        fence = AllLeases(([outer] if outer is not None else []) + held, frozenset(lease.lock_name for lease in held))
        fence.waited_s = sum(lease.waited_s for lease in held)
        with fenced(fence):
            yield fence
    finally:
        for lease in reversed(held):
            coordinator.unlock(lease)
