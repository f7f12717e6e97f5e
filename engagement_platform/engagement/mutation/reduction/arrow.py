"""A Reduction as flat Arrow rows: the table format the fold of a set of orgs (reducer.py, in each Spark
task) hands to the outcome computation (outcome_table.py). Replacement records and cross-field moves
travel as JSON strings, which keeps the tables flat and their schemas stable.

Rows (one org's seqs are positions in its (request_time, request_id) order), `kind` says which:

owner: rows with row[field] == id and coalesce(engagement_date, 0001-01-01) within [date_from,
  date_to] (null = open). action 'rewrite': the id becomes new_id (in new_field); action 'delete':
  the row is deleted at seq deleted_at. `moves` is null unless the id crossed fields: then it is a
  JSON list of [seq, to_field] and the row's owner columns must be settled together
  (row_outcome.settle_owners), because a move into a field erases the id that was there.
engagement: branches of one engagement_id in seq order; a row takes the first branch whose date
  range holds its date if seq < the seq at which its owner ids delete it; action 'delete' or
  'replace' with `record` (JSON, every column but org_id and engagement_id).
external: an id or engagement a request needs that no earlier request of the batch produced.
stats: one row per org.
"""

from __future__ import annotations

import json
from datetime import date, datetime

import pyarrow as pa

from engagement_platform.engagement.mutation.reduction.model import Reduction

OWNER_ACTION_COLUMNS = (
    "org_id",
    "field",
    "id",
    "date_from",
    "date_to",
    "action",
    "new_field",
    "new_id",
    "deleted_at",
    "moves",
)
ENGAGEMENT_ACTION_COLUMNS = ("org_id", "engagement_id", "seq", "date_from", "date_to", "action", "record")
EXTERNAL_TARGET_COLUMNS = ("org_id", "request_id", "target_kind", "field", "id")
STAT_COLUMNS = ("requests_in", "owner_actions", "engagement_actions", "external_targets")

_STRING, _DATE, _LONG = pa.string(), pa.date32(), pa.int64()
REDUCED_ARROW_SCHEMA = pa.schema(
    [
        ("kind", _STRING),
        ("org_id", _STRING),
        ("field", _STRING),
        ("id", _STRING),
        ("date_from", _DATE),
        ("date_to", _DATE),
        ("action", _STRING),
        ("new_field", _STRING),
        ("new_id", _STRING),
        ("deleted_at", _LONG),
        ("moves", _STRING),
        ("engagement_id", _STRING),
        ("seq", _LONG),
        ("record", _STRING),
        ("request_id", _STRING),
        ("target_kind", _STRING),
        *((name, _LONG) for name in STAT_COLUMNS),
    ]
)


def record_to_json(record) -> str:
    return json.dumps(record, default=_iso, sort_keys=True)


def _iso(value):
    if isinstance(value, (date, datetime)):
        return value.isoformat()
    raise TypeError(f"not JSON serializable: {value!r}")


def reduction_table(org_id: str | None, reduction: Reduction, with_external_targets: bool = True) -> pa.Table:
    """One org's Reduction as union rows (REDUCED_ARROW_SCHEMA), built column by column (fast)."""
    owner, engagement = reduction.owner_actions, reduction.engagement_actions
    targets = reduction.external_targets if with_external_targets else ()
    stats = reduction.stats
    parts = [
        (
            len(owner),
            {
                "kind": "owner",
                "field": [a.field for a in owner],
                "id": [a.id for a in owner],
                "date_from": [a.date_from for a in owner],
                "date_to": [a.date_to for a in owner],
                "action": [a.action for a in owner],
                "new_field": [a.fate.new_field for a in owner],
                "new_id": [a.fate.new_id for a in owner],
                "deleted_at": [a.fate.deleted_at for a in owner],
                "moves": [json.dumps(a.fate.moves) if a.fate.moves else None for a in owner],
            },
        ),
        (
            len(engagement),
            {
                "kind": "engagement",
                "engagement_id": [a.engagement_id for a in engagement],
                "seq": [a.seq for a in engagement],
                "date_from": [a.date_from for a in engagement],
                "date_to": [a.date_to for a in engagement],
                "action": [a.action for a in engagement],
                "record": [None if a.record is None else record_to_json(a.record) for a in engagement],
            },
        ),
        (
            len(targets),
            {
                "kind": "external",
                "request_id": [t.request_id for t in targets],
                "target_kind": [t.kind for t in targets],
                "field": [t.field for t in targets],
                "id": [t.id for t in targets],
            },
        ),
        (
            1,
            {
                "kind": "stats",
                "requests_in": [stats.requests_in],
                "owner_actions": [stats.owner_actions],
                "engagement_actions": [stats.engagement_actions],
                "external_targets": [len(reduction.external_targets)],
            },
        ),
    ]
    columns = {}
    for name in REDUCED_ARROW_SCHEMA.names:
        column: list = []
        for size, values in parts:
            value = org_id if name == "org_id" else values.get(name)
            column.extend(value if isinstance(value, list) else [value] * size)
        columns[name] = column
    return pa.Table.from_pydict(columns, schema=REDUCED_ARROW_SCHEMA)
