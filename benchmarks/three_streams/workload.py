"""The fixed workload of the three-stream simulation: its rows, each stream's batch, and the table
content it must end with.

The operations commute: mutations and deletes touch only the seed rows, and ingested rows are never
old enough to expire, so the final table is the same whatever order the batches commit in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import date, timedelta

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.lake.delta import BatchTxn

LOCK_NAME = "engagement_activity"
INGESTION, MUTATION, RETENTION = "ingestion", "mutation", "retention"
STREAMS = (INGESTION, MUTATION, RETENTION)
RULES = {INGESTION: frozenset(), MUTATION: frozenset({INGESTION}), RETENTION: frozenset({INGESTION, MUTATION})}

D0 = date(2026, 1, 1)
SEED_DAYS = 100
RECENT = D0 + timedelta(days=365)  # ingested rows: newer than any retention cutoff
CHECKED_COLUMNS = ["org_id", "engagement_id", "engagement_date", "contact_id", "subject"]


@dataclass(frozen=True)
class StreamConfig:
    name: str
    batches: int
    interval_s: float  # cadence: ticks at start + k * interval (a late batch starts the next tick at once)
    compute_s: float  # simulated compute between reading the table and committing
    keep_alive: bool = False  # coordinated run: keep registering empty batches while others have work


@dataclass(frozen=True)
class Workload:
    orgs: int = 4
    seed_rows_per_org: int = 300
    rows_per_ingest: int = 200
    streams: tuple[StreamConfig, ...] = (
        StreamConfig(INGESTION, 16, 0.15, 0.05, keep_alive=True),
        StreamConfig(MUTATION, 5, 0.45, 0.15),
        StreamConfig(RETENTION, 3, 0.9, 0.25),
    )
    rules: dict[str, frozenset[str]] = field(default_factory=lambda: dict(RULES))  # predecessor sets (coordinated)
    lock_timeout_s: float = 5.0
    max_conflict_retries: int = 50
    deadline_s: float = 120.0

    def stream(self, name: str) -> StreamConfig:
        return next(s for s in self.streams if s.name == name)

    def scaled(self, **batches: int) -> Workload:
        """Same cadences, other batch counts (e.g. scaled(ingestion=40))."""
        return replace(self, streams=tuple(replace(s, batches=batches.get(s.name, s.batches)) for s in self.streams))


def _activity_rows(cols: dict) -> pa.Table:
    n = len(cols["engagement_id"])
    table = pa.table(cols)
    for f in ENGAGEMENT_ACTIVITY.schema:
        if f.name not in table.schema.names:
            table = table.append_column(f, pa.nulls(n, f.type))
    return table.select(ENGAGEMENT_ACTIVITY.schema.names).cast(ENGAGEMENT_ACTIVITY.schema)


def _org(n: int) -> str:
    return f"00D{n:06d}"


def seed_rows(w: Workload) -> pa.Table:
    keys = [(o, k) for o in range(w.orgs) for k in range(w.seed_rows_per_org)]
    return _activity_rows(
        {
            "org_id": [_org(o) for o, _ in keys],
            "engagement_id": [f"s{o:02d}-{k:05d}" for o, k in keys],
            "engagement_date": [D0 + timedelta(days=k % SEED_DAYS) for _, k in keys],
            "subject": ["seed"] * len(keys),
            "batch_id": [0] * len(keys),
        }
    )


def ingest_rows(w: Workload, batch: int) -> pa.Table:
    n = w.rows_per_ingest
    return _activity_rows(
        {
            "org_id": [_org(k % w.orgs) for k in range(n)],
            "engagement_id": [f"i{batch:04d}-{k:05d}" for k in range(n)],
            "engagement_date": [RECENT] * n,
            "subject": ["ingested"] * n,
            "batch_id": [batch] * n,
        }
    )


def mutation_source(w: Workload, batch: int) -> pa.Table:
    """Batch b renames the contact of every seed row with k % batches == b - 1, in every org."""
    groups = w.stream(MUTATION).batches
    keys = [(o, k) for o in range(w.orgs) for k in range(batch - 1, w.seed_rows_per_org, groups)]
    return pa.table(
        {
            "org_id": [_org(o) for o, _ in keys],
            "engagement_id": [f"s{o:02d}-{k:05d}" for o, k in keys],
            "contact_id": [f"003M{batch:03d}"] * len(keys),
        }
    )


def retention_cutoff(w: Workload, batch: int) -> date:
    return D0 + timedelta(days=batch * SEED_DAYS // (w.stream(RETENTION).batches + 1))


def expected_content(w: Workload) -> pa.Table:
    groups = w.stream(MUTATION).batches
    cutoff = retention_cutoff(w, w.stream(RETENTION).batches)
    rows = [
        {
            "org_id": _org(o),
            "engagement_id": f"s{o:02d}-{k:05d}",
            "engagement_date": D0 + timedelta(days=k % SEED_DAYS),
            "contact_id": f"003M{k % groups + 1:03d}",
            "subject": "mutated",
        }
        for o in range(w.orgs)
        for k in range(w.seed_rows_per_org)
        if D0 + timedelta(days=k % SEED_DAYS) >= cutoff
    ]
    for b in range(1, w.stream(INGESTION).batches + 1):
        rows += ingest_rows(w, b).select(CHECKED_COLUMNS).to_pylist()
    return canonical(pa.Table.from_pylist(rows))


def canonical(t: pa.Table) -> pa.Table:
    t = t.select(CHECKED_COLUMNS).cast(pa.schema([ENGAGEMENT_ACTIVITY.schema.field(c) for c in CHECKED_COLUMNS]))
    return t.sort_by([("engagement_id", "ascending")])


def apply_batch(table: DeltaTable, w: Workload, stream: str, batch: int, txn: BatchTxn) -> tuple[int | None, int]:
    """Commit one batch from the snapshot `table` was loaded at: (table version, rows) or (None, 0)
    when the txn shows the batch is already in. Raises CommitFailedError on a conflict."""
    done = table.transaction_version(txn.app_id)
    if done is not None and done >= txn.version:
        return None, 0
    props = txn.commit_properties()
    if stream == INGESTION:
        rows = ingest_rows(w, batch)
        write_deltalake(
            table, rows, mode="append", partition_by=list(ENGAGEMENT_ACTIVITY.partition_by), commit_properties=props
        )
        table.update_incremental()
        return table.version(), rows.num_rows
    if stream == MUTATION:
        metrics = (
            table.merge(
                mutation_source(w, batch),
                "t.org_id = s.org_id AND t.engagement_id = s.engagement_id",
                source_alias="s",
                target_alias="t",
                commit_properties=props,
            )
            .when_matched_update({"contact_id": "s.contact_id", "subject": "'mutated'"})
            .execute()
        )
        return table.version(), metrics["num_target_rows_updated"]
    cutoff = retention_cutoff(w, batch)
    metrics = table.delete(f"engagement_date < '{cutoff.isoformat()}'", commit_properties=props)
    return table.version(), metrics["num_deleted_rows"]
