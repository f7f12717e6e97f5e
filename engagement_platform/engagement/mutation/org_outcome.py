"""What a batch's requests do to the rows of their orgs, for any set of whole orgs: the computation each
Spark task runs over the orgs it holds (rewrite_task.py), with no Spark, Delta or Dagster in it.

Per set of orgs: the requests' targets and what they produce (hold_back.request_targets), the rows that
hold one (affected_rows.rows_holding), the hold-back of requests whose targets are missing, the exact
fold of the rest of each org (reducer.reduce_batch on this process), and the outcome of every row
(outcome_table). Every rule involved is per org, so running it over any partition of the orgs gives
the same result as over the whole batch at once on the driver.

Rows carry two extra columns through it, FILE and ROW (which planned file, which row of it), so the
changed rows can be put back into the files they came from (rewritten_file) and logged as row-level
changes (change_rows).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.mutation.affected_rows import date_spans, rows_holding
from engagement_platform.engagement.mutation.hold_back import affected_keys, hold_back, request_order, request_targets
from engagement_platform.engagement.mutation.outcome_table import ACTION, UPDATE, outcome_table
from engagement_platform.engagement.mutation.reducer import reduce_batch
from engagement_platform.engagement.mutation.request_columns import mutation_requests, typed_record

FILE, ROW = "_file", "_row"  # where a read row came from: planned file index, row index in that file
CANDIDATE = "_candidate"  # a request's row in the driver's candidate table
CHANGE_TYPE = "_change_type"  # Delta's change-feed names: update_preimage | update_postimage | delete


@dataclass
class OrgsOutcome:
    """The orgs' result: which requests wait (by CANDIDATE), what changes, and the counts."""

    held: list[int]  # CANDIDATE of each held-back request, in the order they were found
    missing: dict[int, list[dict]]  # held CANDIDATE -> its missing targets {kind, field, id}
    applied: int  # requests applied
    actions: int  # owner + engagement actions after reduction
    rows_scanned: int  # rows holding a key of the requests
    source: pa.Table  # changed rows (table columns, FILE, ROW) + ACTION (update | delete)
    counts: dict[str, int]  # updated, replaced, deleted, unchanged


def records_of(requests: pa.Table) -> list[dict | None]:
    """The typed record of each request (updates), from its canonical JSON."""
    return [None if text is None else typed_record(json.loads(text)) for text in requests["record"].to_pylist()]


def orgs_outcome(requests: pa.Table, rows: pa.Table) -> OrgsOutcome:
    """`requests`: canonical request columns + CANDIDATE, for whole orgs; `rows`: every row of the files
    planned for those orgs (table columns + FILE, ROW)."""
    records = records_of(requests)
    order = request_order(requests)
    seq = np.empty(len(order), dtype=np.int64)
    seq[order] = np.arange(len(order))
    needs, produces = request_targets(requests, records)
    affected = rows.filter(pa.array(rows_holding(rows, affected_keys(requests, needs, produces), date_spans(requests))))
    held_back = hold_back(requests, needs, produces, seq, affected)
    reduced = reduce_batch(
        mutation_requests(requests, records), order, requests["org_id"].to_pylist(), held_back.active
    )
    source, counts = outcome_table(affected, reduced.actions)
    candidate = requests[CANDIDATE].to_pylist()
    return OrgsOutcome(
        held=[candidate[i] for i in held_back.held],
        missing={candidate[i]: m for i, m in held_back.missing.items()},
        applied=int(held_back.active.sum()),
        actions=reduced.action_count,
        rows_scanned=affected.num_rows,
        source=source,
        counts=counts,
    )


def change_rows(rows: pa.Table, source: pa.Table, schema: pa.Schema) -> pa.Table:
    """Row-level changes of `source` (orgs_outcome) in `schema`'s columns + CHANGE_TYPE: each updated row's
    pre-image (the row as read) and post-image, each deleted row."""
    is_update = pc.equal(source[ACTION], UPDATE)
    updates, deletes = source.filter(is_update), source.filter(pc.invert(is_update))
    before = rows.take(_positions(rows, updates))
    parts = [(before, "update_preimage"), (updates, "update_postimage"), (deletes, "delete")]
    return pa.concat_tables(
        [
            part.select(schema.names)
            .cast(schema)
            .append_column(CHANGE_TYPE, pa.array([kind] * part.num_rows, pa.string()))
            for part, kind in parts
        ]
    )


def _positions(rows: pa.Table, changed: pa.Table) -> pa.Array:
    """Indices in `rows` of the rows `changed` came from (matched on FILE, ROW)."""
    where = pa.table({FILE: rows[FILE], ROW: rows[ROW], "_at": pa.array(np.arange(rows.num_rows))})
    keys = pa.table({FILE: changed[FILE], ROW: changed[ROW], "_n": pa.array(np.arange(changed.num_rows))})
    joined = keys.join(where, keys=[FILE, ROW], join_type="inner").sort_by("_n")
    return joined["_at"]


def rewritten_file(original: pa.Table, changed: pa.Table, schema: pa.Schema) -> pa.Table:
    """One file's rows after the batch: `original` (the file as read, with ROW) without the rows `changed`
    (its rows of orgs_outcome's source) updates or deletes, plus the updated rows' new values."""
    kept = original.filter(pc.invert(pc.is_in(original[ROW], value_set=changed[ROW].combine_chunks())))
    updated = changed.filter(pc.equal(changed[ACTION], UPDATE))
    return pa.concat_tables([kept.select(schema.names).cast(schema), updated.select(schema.names).cast(schema)])
