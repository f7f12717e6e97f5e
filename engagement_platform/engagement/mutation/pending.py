"""The batch's requests as candidate rows, and the pending table's side of a batch.

Candidates are the slice's new valid requests plus every request pending at the pinned version, one
row each (CANDIDATE_SCHEMA); a request an earlier batch already logged or still holds is a replay and
is quarantined instead. Held-back requests either wait in the pending table or, once a horizon ran out
(batches after the first attempt, or hours after the batch that first held them back, both measured
at the batch's pinned as-of time, never the clock at re-run), are quarantined. The pending step writes
its change as one MERGE delta against the current table: upsert what stays, delete what was consumed,
and leave alone what an erasure deleted after the pin (erased_since_pin).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from engagement_platform.engagement.mutation.hold_back import HoldBack
from engagement_platform.engagement.mutation.request_columns import (
    CANONICAL_SCHEMA,
    CheckedRequests,
    canonical_from_json,
)
from engagement_platform.engagement.mutation.request_text import request_json
from engagement_platform.engagement.mutation.tables import ENGAGEMENT_MUTATION_REQUESTS, ENGAGEMENT_MUTATIONS_PENDING
from engagement_platform.ingest.errors import SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import QuarantineContext
from engagement_platform.lake.delta import BatchTxn, DeltaLake, sql_literal, text_column
from engagement_platform.lake.quarantine import QUARANTINE_SCHEMA
from engagement_platform.settings import load_settings
from engagement_platform.streams.batch import CommitStep, Outcomes
from engagement_platform.streams.pin import current_version

PENDING_ACTION, UPSERT, PENDING_DELETE = "_pending_action", "upsert", "delete"  # the pending step's MERGE source
APPLY = "apply"  # stage of errors found while applying (targets never arrived)
_TS = pa.timestamp("us", tz="UTC")

# The batch's requests, one row each: canonical columns, then where they come from and how long they may wait.
CANDIDATE_SCHEMA = pa.schema(
    [
        *CANONICAL_SCHEMA,
        ("source_partition", pa.int32()),
        ("source_offset", pa.int64()),
        ("first_seen_batch", pa.int64()),
        ("attempts", pa.int64()),
        ("expires_batch", pa.int64()),
        ("from_pending", pa.bool_()),
        ("first_seen_at", _TS),  # the as-of time of the batch that first held it back (null: this batch)
        ("request_json", pa.string()),
    ]
)


def pending_max_age_hours() -> float:
    """Hours a request may wait in the pending table (EP_MUTATION_PENDING_MAX_AGE_HOURS, default 72), read at run time."""
    return load_settings().mutation.pending_max_age_hours


def read_at(
    lake: DeltaLake, name: str, version: int, filter: ds.Expression | None = None, schema: pa.Schema | None = None
) -> tuple[pa.Table, int, int]:
    """(rows, files read, files in the table) of `name` at `version` (-1: not created yet)."""
    if version < 0:
        return schema.empty_table(), 0, 0
    dataset = lake.table(name, version).to_pyarrow_dataset()
    total = len(dataset.files)
    if filter is None:
        return dataset.to_table(), total, total
    fragments = list(dataset.get_fragments(filter=filter))
    return dataset.to_table(filter=filter), len(fragments), total


@dataclass
class Candidates:
    """The batch's requests: `table` (carried, then new; CANDIDATE_SCHEMA) and each one's typed record."""

    table: pa.Table
    records: list[dict | None]
    carried: pa.Table  # from the pending table at the pinned version
    arrived: pa.Table  # the slice's valid requests
    new: pa.Table  # arrived minus replays
    replayed: np.ndarray  # per arrived row: an earlier batch already logged it, or it is pending


def gather_candidates(
    lake: DeltaLake, pending_version: int, checked: CheckedRequests, batch_id: int, horizon_batches: int
) -> Candidates:
    log_version = current_version(lake, ENGAGEMENT_MUTATION_REQUESTS.name)
    pending_rows, _, _ = read_at(
        lake, ENGAGEMENT_MUTATIONS_PENDING.name, pending_version, schema=ENGAGEMENT_MUTATIONS_PENDING.schema
    )
    carried, carried_records = _carried(pending_rows)
    arrived = _new_candidates(checked.requests, batch_id, horizon_batches)
    seen = pa.concat_arrays(
        [_already_logged(lake, log_version, arrived, batch_id), pc.unique(_keys(carried)).cast(pa.string())]
    )
    replayed = np.asarray(pc.is_in(_keys(arrived), value_set=seen).to_numpy(zero_copy_only=False), dtype=bool)
    new = arrived.filter(pa.array(~replayed))
    records = carried_records + [r for r, again in zip(checked.records, replayed.tolist()) if not again]
    return Candidates(pa.concat_tables([carried, new]), records, carried, arrived, new, replayed)


def _carried(pending: pa.Table) -> tuple[pa.Table, list[dict | None]]:
    """The pending table's requests as candidate rows (CANDIDATE_SCHEMA) and their typed records."""
    texts = pending["request_json"].to_pylist()
    canonical, records = canonical_from_json(texts)
    columns = {name: canonical[name] for name in CANONICAL_SCHEMA.names}
    columns.update(
        {
            name: pending[name]
            for name in ("source_partition", "source_offset", "first_seen_batch", "attempts", "expires_batch")
        }
    )
    columns["from_pending"] = pa.array([True] * pending.num_rows, pa.bool_())
    # null in rows written before the column existed: the clock starts now
    columns["first_seen_at"] = (
        pending["first_seen_at"] if "first_seen_at" in pending.column_names else pa.nulls(pending.num_rows, _TS)
    )
    columns["request_json"] = pending["request_json"]
    return pa.table(columns).cast(CANDIDATE_SCHEMA), records


def _new_candidates(checked: pa.Table, batch_id: int, horizon_batches: int) -> pa.Table:
    """The slice's checked requests as candidate rows: first seen in this batch."""
    n = checked.num_rows
    columns = {name: checked[name] for name in CANONICAL_SCHEMA.names}
    columns.update(
        source_partition=checked[SOURCE_PARTITION],
        source_offset=checked[SOURCE_OFFSET],
        first_seen_batch=pa.array([batch_id] * n, pa.int64()),
        attempts=pa.array([0] * n, pa.int64()),
        expires_batch=pa.array([batch_id + horizon_batches] * n, pa.int64()),
        from_pending=pa.array([False] * n, pa.bool_()),
        first_seen_at=pa.nulls(n, _TS),
        request_json=request_json(checked),
    )
    return pa.table(columns).cast(CANDIDATE_SCHEMA)


def _keys(table: pa.Table) -> pa.ChunkedArray:
    """org_id and request_id joined: one string per request, for set lookups."""
    return pc.binary_join_element_wise(table["org_id"], table["request_id"], "\x1f")


def _already_logged(lake: DeltaLake, version_of_log: int, requests: pa.Table, batch_id: int) -> pa.Array:
    """Keys (_keys) of these requests that an earlier batch already logged (a producer retry)."""
    if version_of_log < 0 or requests.num_rows == 0:
        return pa.array([], pa.string())
    orgs = pc.unique(requests["org_id"]).to_pylist()
    ids = text_column("request_id").isin(pc.unique(requests["request_id"]).to_pylist())
    expr = ds.field("org_id").isin(orgs) & ids & (ds.field("batch_id") < batch_id)
    rows, _, _ = read_at(lake, ENGAGEMENT_MUTATION_REQUESTS.name, version_of_log, expr)
    return pc.unique(
        _keys(
            rows.select(["org_id", "request_id"]).cast(
                pa.schema([("org_id", pa.string()), ("request_id", pa.string())])
            )
        )
    )


def split_held(
    candidates: pa.Table, held_back: HoldBack, batch_id: int, as_of: datetime, max_age_hours: float
) -> tuple[list[dict], list[dict]]:
    """(expired, still pending) held-back candidates, as dicts with their `index`, `missing` targets and the
    `horizons` that ran out: `horizon_batches` after the first attempt (expires_batch), or `max_age_hours`
    after the batch that first held it back (first_seen_at), both at this batch's pinned as-of time."""
    max_age = timedelta(hours=max_age_hours)
    held = candidates.take(pa.array(held_back.held, pa.int64())).to_pylist()
    for index, c in zip(held_back.held, held):
        c["index"], c["missing"] = index, held_back.missing[index]
        c["horizons"] = expired_horizons(c, batch_id, as_of, max_age)
    return [c for c in held if c["horizons"]], [c for c in held if not c["horizons"]]


def expired_horizons(c: dict, batch_id: int, as_of: datetime, max_age: timedelta) -> list[str]:
    """Which horizons a held-back request (a candidate row) has run out of at this batch: "batches" and/or "age" (empty: it waits)."""
    out = []
    if batch_id >= c["expires_batch"]:
        out.append("batches")
    if as_of - (c["first_seen_at"] or as_of) >= max_age:
        out.append("age")
    return out


def pending_delta(
    still_pending: list[dict],
    erased: set[tuple[str, str]],
    carried: pa.Table,
    seq: np.ndarray,
    batch_id: int,
    as_of: datetime,
) -> pa.Table:
    """The pending step's change as a MERGE source against the current table (PENDING_ACTION per row):
    upsert what stays pending (in fold order), delete the carried requests this batch consumed."""
    keep = sorted(
        (c for c in still_pending if (c["org_id"], c["request_id"]) not in erased), key=lambda c: seq[c["index"]]
    )
    kept_keys = {(c["org_id"], c["request_id"]) for c in keep}
    consumed = sorted(set(zip(carried["org_id"].to_pylist(), carried["request_id"].to_pylist())) - kept_keys)
    schema = ENGAGEMENT_MUTATIONS_PENDING.schema
    staying = pa.Table.from_pylist(
        [
            dict(
                org_id=c["org_id"],
                request_id=c["request_id"],
                request_time=c["request_time"],
                request_json=c["request_json"],
                missing_targets=json.dumps(c["missing"]),
                first_seen_batch=c["first_seen_batch"],
                last_batch=batch_id,
                attempts=c["attempts"] + 1,
                expires_batch=c["expires_batch"],
                source_partition=c["source_partition"],
                source_offset=c["source_offset"],
                first_seen_at=c["first_seen_at"] or as_of,
            )
            for c in keep
        ],
        schema=schema,
    )
    return pa.concat_tables(
        [
            staying.append_column(PENDING_ACTION, pa.array([UPSERT] * staying.num_rows, pa.string())),
            pa.Table.from_pylist(
                [dict(org_id=o, request_id=r, **{PENDING_ACTION: PENDING_DELETE}) for o, r in consumed],
                schema=schema.append(pa.field(PENDING_ACTION, pa.string())),
            ),
        ]
    )


def pending_step(lake: DeltaLake, delta: pa.Table) -> CommitStep:
    """The pending table's commit: one MERGE of `delta` (pending_delta) with the txn against the
    current table, not an overwrite of the pinned set: rows an erasure deleted after the pin are neither
    in the source nor matched, so they stay deleted."""

    def commit(txn: BatchTxn, _: Outcomes) -> int | None:
        table = lake.ensure(ENGAGEMENT_MUTATIONS_PENDING)
        if lake.already_committed(ENGAGEMENT_MUTATIONS_PENDING.name, txn):
            return None
        if delta.num_rows == 0:
            return None  # nothing carried, nothing held back: no commit (a re-run finds nothing to do either)
        orgs = ", ".join(sql_literal(o) for o in pc.unique(delta["org_id"]).to_pylist())
        (
            table.merge(
                delta,
                predicate=f"t.org_id IN ({orgs}) AND t.org_id = s.org_id AND t.request_id = s.request_id",
                source_alias="s",
                target_alias="t",
                merge_schema=True,
                commit_properties=txn.commit_properties(),
            )
            .when_matched_update_all(predicate=f"s.{PENDING_ACTION} = '{UPSERT}'", except_cols=[PENDING_ACTION])
            .when_matched_delete(predicate=f"s.{PENDING_ACTION} = '{PENDING_DELETE}'")
            .when_not_matched_insert_all(predicate=f"s.{PENDING_ACTION} = '{UPSERT}'", except_cols=[PENDING_ACTION])
            .execute()
        )
        return table.version()  # the MERGE left the object at its own commit (updating it could pass a later writer's)

    return CommitStep(ENGAGEMENT_MUTATIONS_PENDING.name, commit)


def _request_keys(
    lake: DeltaLake, name: str, version: int, filter: ds.Expression | None = None
) -> set[tuple[str, str]]:
    if version < 0:
        return set()
    rows = lake.table(name, version).to_pyarrow_dataset().to_table(columns=["org_id", "request_id"], filter=filter)
    return set(zip(rows["org_id"].to_pylist(), rows["request_id"].to_pylist()))


def erased_since_pin(
    lake: DeltaLake, app_id: str, batch_id: int, pinned_pending: int, new: pa.Table
) -> set[tuple[str, str]]:
    """(org_id, request_id) of this batch's requests that another writer (a GDPR erasure) deleted after the
    batch's pin; a re-run must not write them back (to pending or quarantine) although its decisions,
    computed against the pin, still count them. The rule: the pending table changes only through this
    stream's (`app_id`) one commit per batch and erasure deletes, so every key a commit of another app removed
    from it after the pinned version was erased (optimize/vacuum commits remove no key); and the request log
    is append-only apart from erasures, so a request this batch already logged whose row is gone was erased."""
    erased: set[tuple[str, str]] = set()
    name = ENGAGEMENT_MUTATIONS_PENDING.name
    current = current_version(lake, name)
    if current > pinned_pending >= 0:
        for commit in lake.history(name, since=pinned_pending + 1):
            version = int(commit["version"])
            if version > pinned_pending and commit.get("app_id") != app_id:
                erased |= _request_keys(lake, name, version - 1) - _request_keys(lake, name, version)
    log = ENGAGEMENT_MUTATION_REQUESTS.name
    if new.num_rows and lake.exists(log) and (lake.committed_version(log, app_id) or -1) >= batch_id:
        new_keys = set(zip(new["org_id"].to_pylist(), new["request_id"].to_pylist()))
        mine = ds.field("org_id").isin(sorted({o for o, _ in new_keys})) & (ds.field("batch_id") == batch_id)
        erased |= new_keys - _request_keys(lake, log, current_version(lake, log), mine)
    return erased


def quarantine_candidates(
    candidates: list[dict], ctx: QuarantineContext, plugin: str, code: str, message: Callable[[dict], str]
) -> pa.Table:
    """Quarantine rows (stage `apply`) for candidate rows (dicts of CANDIDATE_SCHEMA, `missing` added for held-back ones)."""
    rows = []
    for c in candidates:
        text, missing = c["request_json"], c.get("missing")
        rows.append(
            dict(
                pipeline=ctx.pipeline,
                batch_id=ctx.batch_id,
                row_id=f"{ctx.source}:{c['source_partition']}:{c['source_offset']}",
                source=ctx.source,
                source_partition=c["source_partition"],
                source_offset=c["source_offset"],
                org_id=c["org_id"],
                raw=text.encode(),
                input=text,
                stage=APPLY,
                plugin=plugin,
                column_name=None,
                error_code=code,
                message=message(c),
                value=json.dumps(missing) if missing else None,
                quarantined_at=ctx.at,
                quarantine_date=ctx.at.date(),
            )
        )
    return pa.Table.from_pylist(rows, schema=QUARANTINE_SCHEMA)


def describe_missing(missing: list[dict]) -> str:
    return ", ".join(f"{m['field'] or 'engagement_id'}={m['id']}" for m in missing)
