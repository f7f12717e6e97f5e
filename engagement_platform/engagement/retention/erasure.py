"""Where an erased subject can be, besides engagement_activity's id columns, and how it is found
(no Dagster, no Spark): the tables of ERASABLE are read at a pinned version, pruned to the orgs
involved, and a row is erased when its content mentions the subject (requests.mentions).
Quarantined records without an org (they did not parse far enough) are matched on content alone.
The deletes name rows by their keys, never by the subject id: Delta logs a delete's predicate in clear.
`rows_naming` counts what is left by the suppression list's hashes (the check needs no id).

Vacuum: deletes only tombstone files; the layout upkeep (daily) vacuums VACUUMED_TABLES and expires the
logs of WINDOW_TABLES (lake/row_erasure.py) once older than half the erasure window: the deleted rows'
data and change-data files go, and the log entries whose statistics hold min/max ids in clear.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from engagement_platform.engagement.mutation.tables import (
    ENGAGEMENT_MUTATION_REQUESTS,
    ENGAGEMENT_MUTATIONS_PENDING,
    QUARANTINE_ENGAGEMENT_MUTATIONS,
)
from engagement_platform.engagement.retention.requests import (
    SUBJECT_FIELDS,
    RetentionRequest,
    activity_request,
    content_request,
)
from engagement_platform.engagement.retention.tables import GDPR_AUDIT, QUARANTINE_ENGAGEMENT_GDPR
from engagement_platform.engagement.tables import (
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_ACTIVITY_CHANGES,
    QUARANTINE_ENGAGEMENT_INGESTION,
)
from engagement_platform.lake.delta import DeltaLake, TableSpec, text_column
from engagement_platform.lake.suppression import Suppressed
from engagement_platform.streams.pin import current_version

UTC_US = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class Erasable:
    """A table besides engagement_activity that can hold a subject: where to look, how rows are keyed."""

    spec: TableSpec
    key: tuple[str, str]  # the delete's key; every row of a key holds the same content
    texts: tuple[str, ...]  # content searched for the subject id


ERASABLE = (
    Erasable(ENGAGEMENT_MUTATIONS_PENDING, ("org_id", "request_id"), ("request_json",)),
    Erasable(ENGAGEMENT_MUTATION_REQUESTS, ("org_id", "request_id"), ("request_json",)),
    Erasable(QUARANTINE_ENGAGEMENT_MUTATIONS, ("pipeline", "row_id"), ("raw", "input")),
    Erasable(QUARANTINE_ENGAGEMENT_INGESTION, ("pipeline", "row_id"), ("raw", "input")),
)
ERASED_TABLES = (ENGAGEMENT_ACTIVITY.name, *(e.spec.name for e in ERASABLE))
# What the daily full vacuum covers: every table erasure deletes from. engagement_activity's change log is
# one (its rows go by engagement_activity's predicate) but not in ERASED_TABLES: gdpr_audit does not count them.
# The retention stream's own quarantine too: a refused request naming a subject a later one erased is
# purged by the erasure batch (after its commits) and by the upkeep.
VACUUMED_TABLES = (*ERASED_TABLES, ENGAGEMENT_ACTIVITY_CHANGES.name, QUARANTINE_ENGAGEMENT_GDPR.name)
# A table erasure never deletes from whose log could still hold an id from before it stored hashes only.
LOGGED_ELSEWHERE = (GDPR_AUDIT.name,)
# What the upkeep's window passes cover (lake/row_erasure.py): checkpoints and log expiry.
WINDOW_TABLES = (*VACUUMED_TABLES, *LOGGED_ELSEWHERE)


def read_at(lake: DeltaLake, name: str, version: int | None, expr: ds.Expression, columns: list[str]) -> pa.Table:
    version = current_version(lake, name) if version is None else version
    if version < 0:
        return pa.table({c: pa.array([], pa.null()) for c in columns})
    return lake.table(name, version).to_pyarrow_dataset().to_table(columns=columns, filter=expr)


def erasure_matches(
    lake: DeltaLake, erasable: Erasable, version: int | None, erasures: list[RetentionRequest]
) -> list[tuple[tuple[str, str], str]]:
    """(row key, request id) per row of `erasable` (at `version`; None = latest) that mentions an erased subject."""
    if not erasures:
        return []
    expr = (
        text_column("org_id").isin(sorted({r.org_id for r in erasures})) | ds.field("org_id").is_null()
    )  # not every table's partition
    columns = list(dict.fromkeys((*erasable.key, "org_id", *erasable.texts)))
    rows = read_at(lake, erasable.spec.name, version, expr, columns).to_pylist()
    out = []
    for row in rows:
        r = content_request([row[t] for t in erasable.texts], row["org_id"], erasures)
        if r is not None:
            out.append(((row[erasable.key[0]], row[erasable.key[1]]), r.request_id))
    return out


def activity_rows_of_subjects(lake: DeltaLake, erasures: list[RetentionRequest]) -> pa.Table:
    """engagement_activity rows (latest version) of erased subjects, pruned by org partition and id stats."""
    if not erasures or not lake.exists(ENGAGEMENT_ACTIVITY.name):
        return ENGAGEMENT_ACTIVITY.schema.empty_table()
    subjects = sorted({r.subject_id for r in erasures})
    ids = text_column(SUBJECT_FIELDS[0]).isin(subjects)
    for f in SUBJECT_FIELDS[1:]:
        ids = ids | text_column(f).isin(subjects)
    expr = ds.field("org_id").isin(sorted({r.org_id for r in erasures})) & ids
    table = lake.table(ENGAGEMENT_ACTIVITY.name).to_pyarrow_dataset().to_table(filter=expr)
    keep = [
        activity_request(row, erasures) is not None for row in table.select(["org_id", *SUBJECT_FIELDS]).to_pylist()
    ]
    return table.filter(pa.array(keep, pa.bool_()))


def erased_activity_keys(lake: DeltaLake, erasures: list[RetentionRequest]) -> dict[str, set[str]]:
    """org -> engagement ids of the erased subjects' engagement_activity rows (latest version): what the
    delete names instead of the subject ids."""
    keys: dict[str, set[str]] = {}
    for row in activity_rows_of_subjects(lake, erasures).select(["org_id", "engagement_id"]).to_pylist():
        keys.setdefault(row["org_id"], set()).add(row["engagement_id"])
    return keys


LOG_KEY = ["org_id", "_commit_version", "_change_type", "engagement_id"]
# What retention and erasure null in the change log's rows: the people's ids and the free text. What a change was
# (its org, engagement, day, type, duration, source position and change type) stays, so an incremental reader that
# had not read it yet still sees each insert, update and delete (an aggregate stays exact).
REDACTED_IN_LOG = ("lead_id", "contact_id", "account_id", "user_id", "subject", "payload")
LOG_NOT_REDACTED = " OR ".join(f"{c} IS NOT NULL" for c in REDACTED_IN_LOG)


def erased_log_rows(lake: DeltaLake, erasures: list[RetentionRequest]) -> list[dict]:
    """Keys (LOG_KEY) of the change log's rows that hold an erased subject: pre- and post-images included."""
    if not lake.exists(ENGAGEMENT_ACTIVITY_CHANGES.name) or not erasures:
        return []
    subjects: dict[str, set[str]] = {}
    for r in erasures:
        subjects.setdefault(r.org_id, set()).add(r.subject_id)
    table = (
        lake.table(ENGAGEMENT_ACTIVITY_CHANGES.name)
        .to_pyarrow_dataset()
        .to_table(columns=[*LOG_KEY, *SUBJECT_FIELDS], filter=ds.field("org_id").isin(sorted(subjects)))
    )
    return [
        {k: row[k] for k in LOG_KEY}
        for row in table.to_pylist()
        if any(row[f] in subjects[row["org_id"]] for f in SUBJECT_FIELDS)
    ]


def rows_naming(lake: DeltaLake, suppressed: Suppressed) -> dict[str, int]:
    """Rows of each table that name a suppressed subject of their org: by hash, so the check needs only the
    suppression list, never the ids (what `no erased subject anywhere` measures). Each distinct id of an
    org with suppressed subjects is hashed once."""
    counts = {name: 0 for name in VACUUMED_TABLES}
    if not suppressed:
        return counts
    for name in (ENGAGEMENT_ACTIVITY.name, ENGAGEMENT_ACTIVITY_CHANGES.name):
        if not lake.exists(name):
            continue
        rows = (
            lake.table(name)
            .to_pyarrow_dataset()
            .to_table(columns=["org_id", *SUBJECT_FIELDS], filter=ds.field("org_id").isin(suppressed.scopes))
        )
        for org in suppressed.scopes:
            of_org = rows.filter(pc.equal(rows["org_id"], org))
            ids = set()
            for f in SUBJECT_FIELDS:
                ids |= set(pc.unique(of_org[f]).to_pylist())
            named = pa.array(sorted(v for v in ids if v is not None and suppressed.hit(org, [v])), pa.string())
            if len(named):
                hit = pc.or_(*(pc.fill_null(pc.is_in(of_org[f], value_set=named), False) for f in SUBJECT_FIELDS))
                counts[name] += pc.sum(hit).as_py() or 0
    for spec, texts in (*((e.spec, e.texts) for e in ERASABLE), (QUARANTINE_ENGAGEMENT_GDPR, ("raw", "input"))):
        if not lake.exists(spec.name):
            continue
        expr = (
            text_column("org_id").isin(suppressed.scopes) | ds.field("org_id").is_null()
        )  # not every table's partition
        rows = (
            lake.table(spec.name)
            .to_pyarrow_dataset()
            .to_table(columns=list(dict.fromkeys(("org_id", *texts))), filter=expr)
        )
        counts[spec.name] = sum(
            1 for r in rows.to_pylist() if suppressed.content_hit(r["org_id"], [r[t] for t in texts])
        )
    return counts


def subject_rows_remaining(lake: DeltaLake, erasures: list[RetentionRequest], secret: bytes) -> dict[str, int]:
    """Rows of the erased subjects still in each table (their ids hashed like the suppression list's)."""
    return rows_naming(lake, Suppressed.of_subjects(secret, ((r.org_id, r.subject_id) for r in erasures)))
