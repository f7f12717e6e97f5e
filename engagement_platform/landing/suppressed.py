"""A landing pipeline whose records name people (its `suppression:` section, ingest/config.SuppressionSpec)
drops the records of erased subjects before anything is stored: a valid record by its subject columns in
its org / tenant, a rejected one by its raw content. They are counted by hash in the lake's
suppressed-records table, never kept, quarantine included."""

from __future__ import annotations

import pyarrow as pa

from engagement_platform.ingest.config import SuppressionSpec
from engagement_platform.lake.suppression import Suppressed
from engagement_platform.lake.suppression_tables import drop_suppressed_quarantine


def drop_suppressed_records(
    good: pa.Table, quarantine: pa.Table, spec: SuppressionSpec, suppressed: Suppressed
) -> tuple[pa.Table, pa.Table, list[tuple[str, str]]]:
    """(target rows, quarantine rows, (scope, hash) per dropped record)."""
    if not suppressed:
        return good, quarantine, []
    scopes = good[spec.scope_column].to_pylist() if spec.scope_column else [spec.scope] * good.num_rows
    ids = [good[c].to_pylist() for c in spec.subject_columns]
    keep, hits = [], []
    for i, scope in enumerate(scopes):
        found = suppressed.hit(
            None if scope is None else str(scope), [None if v[i] is None else str(v[i]) for v in ids]
        )
        keep.append(found is None)
        if found:
            hits.append((str(scope), found))
    quarantine, quarantined_hits = drop_suppressed_quarantine(quarantine, suppressed)
    return good.filter(pa.array(keep, pa.bool_())), quarantine, hits + quarantined_hits
