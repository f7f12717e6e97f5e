"""What a profile erasure batch records: the rows each request removed, table by table (Tally, carried in
each rewrite commit's metadata so that a re-run reads it back), the suppression list's rows (each erased id
as its keyed hash), the audit table's rows (one per request) and the batch's result (its run metadata)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.suppression import subject_hash
from engagement_platform.profiles.erasure.identity import naming_rows
from engagement_platform.profiles.erasure.validate import ErasureRequest
from engagement_platform.profiles.tables import PROFILE_ERASED_SUBJECTS, PROFILE_ERASURE_AUDIT
from engagement_platform.streams.batch import Outcomes
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.spec import batch_metadata

REMOVED_KEY = "rows_removed_by_request"  # a rewrite commit's metadata: JSON {request_id: rows}


class Tally:
    """Rows each request's ids account for, table by table (the first request in order that names a row
    gets it); read back from a rewrite commit's metadata when an earlier attempt made that commit."""

    def __init__(self, requests: list[ErasureRequest], ids: dict[str, set[str]]):
        self.requests, self.ids = requests, ids
        self.removed: dict[str, dict[str, int]] = {r.request_id: {} for r in requests}

    def remover(self, table: str, tenants: set[str]):
        def remove(rows: pa.Table) -> pa.Array:
            mask = pa.array([False] * rows.num_rows, pa.bool_())
            for r in self.requests:
                if r.tenant not in tenants:
                    continue
                hit = naming_rows(rows, self.ids[r.request_id])
                if "tenant" in rows.column_names:
                    hit = pc.and_(hit, pc.equal(rows["tenant"], r.tenant))
                new = pc.and_(hit, pc.invert(mask))
                self.add(r.request_id, table, pc.sum(new).as_py() or 0)
                mask = pc.or_(mask, new)
            return mask

        return remove

    def add(self, request_id: str, table: str, n: int) -> None:
        counts = self.removed[request_id]
        counts[table] = counts.get(table, 0) + n

    def of_table(self, table: str) -> dict:
        return {REMOVED_KEY: json.dumps({rid: c.get(table, 0) for rid, c in self.removed.items()}, sort_keys=True)}

    def read_back(self, lake: DeltaLake, table: str, txn: BatchTxn) -> None:
        """Adds the counts of `txn`'s commit to `table` (made by an earlier attempt of this batch)."""
        commit = lake.batch_commit(table, txn.app_id, txn.version) or {}
        for rid, n in json.loads(commit.get(REMOVED_KEY, "{}")).items():
            if rid in self.removed:
                self.add(rid, table, n)


def erased_subject_rows(
    requests: list[ErasureRequest], ids: dict[str, set[str]], secret: bytes, plan: BatchPlan, at: datetime
) -> pa.Table:
    """The suppression list's rows: every erased id of each request, as its keyed hash."""
    rows = [
        dict(
            tenant=r.tenant,
            subject_hash=subject_hash(secret, r.tenant, i),
            request_id=r.request_id,
            erased_at=at,
            batch_id=plan.batch_id,
        )
        for r in requests
        for i in sorted(ids[r.request_id])
    ]
    return pa.Table.from_pylist(rows, schema=PROFILE_ERASED_SUBJECTS.schema)


def audit_rows(
    requests: list[ErasureRequest], ids: dict[str, set[str]], tally: Tally, secret: bytes, plan: BatchPlan
) -> pa.Table:
    now = datetime.now(UTC)
    rows = [
        dict(
            tenant=r.tenant,
            request_id=r.request_id,
            subject_hash=subject_hash(secret, r.tenant, r.subject_id),
            ids_erased=len(ids[r.request_id]),
            request_time=r.request_time,
            completed_at=now,
            rows_removed=sum(tally.removed[r.request_id].values()),
            rows_removed_by_table=json.dumps(tally.removed[r.request_id], sort_keys=True),
            batch_id=plan.batch_id,
            source_partition=r.source_partition,
            source_offset=r.source_offset,
        )
        for r in requests
    ]
    return pa.Table.from_pylist(rows, schema=PROFILE_ERASURE_AUDIT.schema)


@dataclass
class ProfileErasureResult:
    plan: BatchPlan
    requests_read: int
    requests_applied: int
    requests_quarantined: int
    requests_suppressed: int
    ids_erased: int
    rows_removed: dict[str, int]
    versions: Outcomes
    tenants: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    bytes_written: int = 0  # by this attempt's commits (rewritten files, appended rows)
    bytes_removed: int = 0  # files those commits took out of their tables

    def metadata(self) -> dict:
        return batch_metadata(
            self.plan,
            self.versions,
            self.seconds,
            requests_read=self.requests_read,
            requests_applied=self.requests_applied,
            requests_quarantined=self.requests_quarantined,
            requests_suppressed=self.requests_suppressed,
            ids_erased=self.ids_erased,
            rows_removed=sum(self.rows_removed.values()),
            bytes_rewritten=self.bytes_written,
            bytes_removed=self.bytes_removed,
            **{f"rows_removed_{t.replace('/', '_')}": n for t, n in self.rows_removed.items()},
            tenants=",".join(self.tenants),
        )
