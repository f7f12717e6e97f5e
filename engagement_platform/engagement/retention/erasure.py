"""Where an erased subject can be, besides engagement_activity's id columns, and how it is found
(no Dagster, no Spark): the tables of ERASABLE are read at a pinned version, pruned to the orgs
involved, and a row is erased when its content mentions the subject (requests.mentions).
Quarantined records without an org (they did not parse far enough) are matched on content alone.

Vacuum: deletes only tombstone files; `vacuum_erased_tables` (run daily by the layout upkeep, over
VACUUMED_TABLES) deletes them, and the change-data files that also hold the deleted rows, once older
than the retention.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import CommitProperties
from deltalake.exceptions import CommitFailedError

from engagement_platform.engagement.mutation.tables import (
    ENGAGEMENT_MUTATION_REQUESTS, ENGAGEMENT_MUTATIONS_PENDING, QUARANTINE_ENGAGEMENT_MUTATIONS,
)
from engagement_platform.engagement.retention.requests import SUBJECT_FIELDS, RetentionRequest, activity_request, content_request
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_ACTIVITY_CHANGES, QUARANTINE_ENGAGEMENT_INGESTION
from engagement_platform.lake.delta import DeltaLake, TableSpec
from engagement_platform.streams.pin import current_version

UTC_US = pa.timestamp("us", tz="UTC")
VACUUM_APP_ID = "engagement.retention.vacuum"


@dataclass(frozen=True)
class Erasable:
    """A table besides engagement_activity that can hold a subject: where to look, how rows are keyed."""

    spec: TableSpec
    key: tuple[str, str]  # the delete's key; every row of a key holds the same content
    texts: tuple[str, ...]  # content searched for the subject id
    arrived: str | None  # arrival time column (the check ignores rows that came after the erasure)


ERASABLE = (
    Erasable(ENGAGEMENT_MUTATIONS_PENDING, ("org_id", "request_id"), ("request_json",), None),
    Erasable(ENGAGEMENT_MUTATION_REQUESTS, ("org_id", "request_id"), ("request_json",), "received_at"),
    Erasable(QUARANTINE_ENGAGEMENT_MUTATIONS, ("pipeline", "row_id"), ("raw", "input"), "quarantined_at"),
    Erasable(QUARANTINE_ENGAGEMENT_INGESTION, ("pipeline", "row_id"), ("raw", "input"), "quarantined_at"),
)
ERASED_TABLES = (ENGAGEMENT_ACTIVITY.name, *(e.spec.name for e in ERASABLE))
# What the daily full vacuum covers: every table erasure deletes from. engagement_activity's change log is
# one (its rows go by engagement_activity's predicate) but not in ERASED_TABLES: gdpr_audit does not count them.
VACUUMED_TABLES = (*ERASED_TABLES, ENGAGEMENT_ACTIVITY_CHANGES.name)


def read_at(lake: DeltaLake, name: str, version: int | None, expr: ds.Expression, columns: list[str]) -> pa.Table:
    version = current_version(lake, name) if version is None else version
    if version < 0:
        return pa.table({c: pa.array([], pa.null()) for c in columns})
    return lake.table(name, version).to_pyarrow_dataset().to_table(columns=columns, filter=expr)


def erasure_matches(lake: DeltaLake, erasable: Erasable, version: int | None, erasures: list[RetentionRequest],
                    arrived_by: datetime | None = None) -> list[tuple[tuple[str, str], str]]:
    """(row key, request id) per row of `erasable` (at `version`; None = latest) that mentions an erased subject."""
    if not erasures:
        return []
    expr = ds.field("org_id").isin(sorted({r.org_id for r in erasures})) | ds.field("org_id").is_null()
    if arrived_by is not None and erasable.arrived:
        expr = expr & (ds.field(erasable.arrived) <= pa.scalar(arrived_by, UTC_US))
    columns = list(dict.fromkeys((*erasable.key, "org_id", *erasable.texts)))
    rows = read_at(lake, erasable.spec.name, version, expr, columns).to_pylist()
    out = []
    for row in rows:
        r = content_request([row[t] for t in erasable.texts], row["org_id"], erasures)
        if r is not None:
            out.append(((row[erasable.key[0]], row[erasable.key[1]]), r.request_id))
    return out


def activity_rows_of_subjects(lake: DeltaLake, erasures: list[RetentionRequest], arrived_by: datetime | None = None) -> pa.Table:
    """engagement_activity rows (latest version) of erased subjects, pruned by org partition and id stats."""
    if not erasures or not lake.exists(ENGAGEMENT_ACTIVITY.name):
        return ENGAGEMENT_ACTIVITY.schema.empty_table()
    subjects = sorted({r.subject_id for r in erasures})
    # Compared through a cast: files a delta-rs delete/merge rewrote store strings as string_view, and
    # pyarrow cannot compare their statistics with a string literal (the read would raise).
    ids = ds.field(SUBJECT_FIELDS[0]).cast(pa.string()).isin(subjects)
    for f in SUBJECT_FIELDS[1:]:
        ids = ids | ds.field(f).cast(pa.string()).isin(subjects)
    expr = ds.field("org_id").isin(sorted({r.org_id for r in erasures})) & ids
    if arrived_by is not None:
        expr = expr & (ds.field("ingestion_time") <= pa.scalar(arrived_by, UTC_US))
    table = lake.table(ENGAGEMENT_ACTIVITY.name).to_pyarrow_dataset().to_table(filter=expr)
    keep = [activity_request(row, erasures) is not None for row in table.select(["org_id", *SUBJECT_FIELDS]).to_pylist()]
    return table.filter(pa.array(keep, pa.bool_()))


def subject_rows_remaining(lake: DeltaLake, erasures: list[RetentionRequest], as_of: datetime) -> dict[str, int]:
    """Rows of the erased subjects still in each table, among rows that arrived by `as_of` (what the
    blocking check measures; rows arriving later are the subject's new activity, not a failed erasure)."""
    remaining = {ENGAGEMENT_ACTIVITY.name: activity_rows_of_subjects(lake, erasures, as_of).num_rows}
    for e in ERASABLE:
        remaining[e.spec.name] = len(erasure_matches(lake, e, None, erasures, as_of))
    return remaining


def vacuum_erased_tables(lake: DeltaLake, retention_hours: int, tables: tuple[str, ...] | None = None, dry_run: bool = False) -> dict[str, int]:
    """Full vacuum (tombstoned data files and change-data files older than the retention) of the
    tables erasure deletes from; files per table (-1: the vacuum's log commit conflicted, retried next run)."""
    out = {}
    for name in tables if tables is not None else VACUUMED_TABLES:
        if not lake.exists(name):
            continue
        try:
            files = lake.table(name).vacuum(
                retention_hours=retention_hours, dry_run=dry_run, enforce_retention_duration=retention_hours >= 168, full=True,
                commit_properties=CommitProperties(custom_metadata={"app_id": VACUUM_APP_ID}),
            )
            out[name] = len(files)
        except CommitFailedError:
            out[name] = -1
    return out
