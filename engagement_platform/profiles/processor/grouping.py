"""Which tenants one processor run merges (pure: no Dagster, no lake).

A run's fixed cost (a process, Dagster's run events, the Spark job's start, the commits) is paid per run,
not per tenant, so tenants with staged changes share runs. A Dagster run covers one partition or a range of
partitions in the order they were added, so a group is a stretch of consecutive tenant partitions that all
have work ready: a tenant in flight, paused or backing off ends a stretch, and so does the size bound.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence


def tenant_groups(ready: Collection[str], order: Sequence[str], per_run: int) -> list[list[str]]:
    """`ready` tenants cut into runs: each a list of consecutive tenants of `order` (the partitions' order),
    all ready, at most `per_run` long; every ready tenant of `order` in exactly one group, in order."""
    groups: list[list[str]] = []
    current: list[str] = []
    for tenant in order:
        if tenant not in ready or len(current) == per_run:
            if current:
                groups.append(current)
            current = []
        if tenant in ready:
            current.append(tenant)
    if current:
        groups.append(current)
    return groups


def newest_failed(runs: Iterable[tuple[list[str], bool]]) -> set[str]:
    """Tenants whose newest run failed, from (tenants covered, failed) of runs, newest first: a tenant of a
    failed run of many is retried in a run of its own, so a tenant that fails alone is counted and paused
    alone instead of holding back the others."""
    seen: set[str] = set()
    failed: set[str] = set()
    for tenants, did_fail in runs:
        for tenant in tenants:
            if tenant not in seen:
                seen.add(tenant)
                if did_fail:
                    failed.add(tenant)
    return failed
