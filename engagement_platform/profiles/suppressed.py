"""Profile changes that name an erased identity are dropped before they are stored: the dumper (CDC),
backfill (snapshot rows) and the erasure stream's own repeated requests use this. A change names a
suppressed subject when its primary id or one of its related ids is on the tenant's suppression list
(lake/suppression.py); only tenants with erased identities are hashed."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa

from engagement_platform.lake.suppression import Suppressed


def drop_suppressed_changes(rows: pa.Table, suppressed: Suppressed) -> tuple[pa.Table, list[tuple[str, str]]]:
    """`rows` (tenant, primary_id, related_ids as a list) without the changes naming a suppressed id of their
    tenant, and the (tenant, hash) of each dropped one."""
    if not suppressed or rows.num_rows == 0:
        return rows, []
    keep, hits = [], []
    for tenant, primary, related in zip(
        rows["tenant"].to_pylist(), rows["primary_id"].to_pylist(), rows["related_ids"].to_pylist()
    ):
        found = suppressed.hit(tenant, [primary, *(related or [])])
        keep.append(found is None)
        if found:
            hits.append((tenant, found))
    return (rows.filter(pa.array(keep, pa.bool_())), hits) if hits else (rows, [])


SUPPRESSED_HASH = "_suppressed_hash"  # the column mark_suppressed adds: the hash a change names, or null


def mark_suppressed(suppressed: Suppressed) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function for Spark tasks: each change with SUPPRESSED_HASH set when it names a suppressed
    id of its tenant (the list and the secret travel with the task; the rows never leave the executors)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            found = [
                suppressed.hit(tenant, [primary, *(related or [])])
                for tenant, primary, related in zip(
                    batch.column("tenant").to_pylist(),
                    batch.column("primary_id").to_pylist(),
                    batch.column("related_ids").to_pylist(),
                )
            ]
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, pa.array(found, pa.string())], names=[*batch.schema.names, SUPPRESSED_HASH]
            )

    return run
