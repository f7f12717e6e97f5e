"""A lake's suppression list and its audit as Delta tables (the hashing itself is in suppression.py).

`<lake>_erased_subjects`: one row per erasure request: scope (org or tenant), the subject's keyed hash, the
request id, when and in which batch. Appended by the erasure batch before it deletes anything, so from
the moment a delete is visible, every writer already drops the subject's records.

`<lake>_suppressed_records`: per batch of any stream, how many records naming each suppressed subject it
dropped (hash only). What the conservation checks add to "records out", and what an erasure's metadata
reports as "records suppressed since".
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec
from engagement_platform.lake.suppression import Suppressed
from engagement_platform.streams.batch import CommitStep, Outcomes

_TS = pa.timestamp("us", tz="UTC")
HIT_SCHEMA = pa.schema([("scope", pa.string()), ("subject_hash", pa.string())])


def erased_subjects_spec(name: str, scope: str) -> TableSpec:
    return TableSpec(
        name=name,
        schema=pa.schema(
            [
                (scope, pa.string()),
                ("subject_hash", pa.string()),
                ("request_id", pa.string()),
                ("erased_at", _TS),
                ("batch_id", pa.int64()),
            ]
        ),
        change_data_feed=False,
        stats_columns=(scope, "subject_hash", "batch_id"),
        description=f"The suppression list: one row per erased subject (keyed hash, never the id) per {scope}.",
    )


def suppressed_records_spec(name: str, scope: str) -> TableSpec:
    return TableSpec(
        name=name,
        schema=pa.schema(
            [
                (scope, pa.string()),
                ("subject_hash", pa.string()),
                ("stream", pa.string()),
                ("batch_id", pa.int64()),
                ("records", pa.int64()),
                ("recorded_at", _TS),
            ]
        ),
        change_data_feed=False,
        stats_columns=("stream", "batch_id", "recorded_at"),
        description=f"Records dropped because they name an erased subject: per batch, stream, {scope} and subject hash.",
    )


def load_suppressed(lake: DeltaLake, spec: TableSpec, secret: bytes, version: int | None = None) -> Suppressed:
    """The suppression list at `version` (None: latest; -1 or no table: empty)."""
    if version is not None and version < 0 or not lake.exists(spec.name):
        return Suppressed(secret)
    scope = spec.schema.names[0]
    rows = lake.table(spec.name, version).to_pyarrow_dataset().to_table(columns=[scope, "subject_hash"])
    return Suppressed.of(secret, zip(rows[scope].to_pylist(), rows["subject_hash"].to_pylist()))


def hits_table(hits: Iterable[tuple[str, str]]) -> pa.Table:
    """(scope, hash) per dropped record as a table (what Spark tasks hand back)."""
    scopes, hashes = zip(*hits) if hits else ((), ())
    return pa.table(
        {"scope": pa.array(scopes, pa.string()), "subject_hash": pa.array(hashes, pa.string())}, schema=HIT_SCHEMA
    )


def suppressed_rows(spec: TableSpec, hits: pa.Table, stream: str, batch_id: int, at: datetime) -> pa.Table:
    """One audit row per (scope, hash) of a batch's dropped records, with their count."""
    scope = spec.schema.names[0]
    if hits.num_rows == 0:
        return spec.schema.empty_table()
    grouped = hits.group_by(["scope", "subject_hash"]).aggregate([("subject_hash", "count")])
    n = grouped.num_rows
    return pa.table(
        {
            scope: grouped["scope"],
            "subject_hash": grouped["subject_hash"],
            "stream": pa.repeat(pa.scalar(stream, pa.string()), n),
            "batch_id": pa.repeat(pa.scalar(batch_id, pa.int64()), n),
            "records": pc.cast(grouped["subject_hash_count"], pa.int64()),
            "recorded_at": pa.repeat(pa.scalar(at, _TS), n),
        },
        schema=spec.schema,
    )


def suppressed_step(lake: DeltaLake, spec: TableSpec, rows: pa.Table) -> CommitStep:
    """The batch's audit rows, committed with its txn; no commit when it dropped nothing."""

    def commit(txn: BatchTxn, _: Outcomes) -> int | None:
        return lake.append(spec, rows, txn) if rows.num_rows else None

    return CommitStep(spec.name, commit)


def suppressed_in_batch(lake: DeltaLake, spec: TableSpec, stream: str, batch_id: int) -> int:
    """Records one batch of `stream` dropped (read back from the table, for the conservation checks)."""
    if not lake.exists(spec.name):
        return 0
    rows = lake.read(spec.name, filters=[("stream", "=", stream), ("batch_id", "=", batch_id)], columns=["records"])
    return int(pc.sum(rows["records"]).as_py() or 0) if rows.num_rows else 0


def suppressed_records_total(lake: DeltaLake, spec: TableSpec) -> int:
    """Records dropped by every stream since the first erasure."""
    if not lake.exists(spec.name):
        return 0
    rows = lake.read(spec.name, columns=["records"])
    return int(pc.sum(rows["records"]).as_py() or 0) if rows.num_rows else 0


def drop_suppressed_quarantine(quarantine: pa.Table, suppressed: Suppressed) -> tuple[pa.Table, list[tuple[str, str]]]:
    """Quarantine rows (QUARANTINE_SCHEMA, one per error) without the records whose raw content or parsed
    input names a suppressed subject of their org (any org's, for a record without one); the (scope, hash)
    of each dropped record (once per record, not per error)."""
    if not suppressed or quarantine.num_rows == 0:
        return quarantine, []
    keep, hits, seen = [], [], set()
    for row_id, org, raw, parsed in zip(*(quarantine[c].to_pylist() for c in ("row_id", "org_id", "raw", "input"))):
        found = suppressed.content_hit(org, [raw, parsed])
        keep.append(found is None)
        if found and row_id not in seen:
            seen.add(row_id)
            hits.append(found)
    return quarantine.filter(pa.array(keep, pa.bool_())), hits


def suppression_of(lake: DeltaLake, list_name: str) -> tuple[TableSpec, TableSpec] | None:
    """(suppression list, suppressed-records table) of the lake whose list is `list_name` (its scope column
    read from the table), or None while nothing was ever erased there (no list yet)."""
    if not lake.exists(list_name):
        return None
    scope = lake.table(list_name).to_pyarrow_dataset().schema.names[0]
    counts = list_name.removesuffix("_erased_subjects") + "_suppressed_records"
    return erased_subjects_spec(list_name, scope), suppressed_records_spec(counts, scope)
