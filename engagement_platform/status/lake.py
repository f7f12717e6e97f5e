"""The lake's side of status: the checkpoint store (which streams planned, each one's latest batch), the txn
versions of the tables an unfinished batch writes (which of them already hold it), and the processor's view
of each tenant (replication lag, the staging versions left to merge).

A batch's state: none (nothing planned), planned (plan row only), committing (some of its tables' Delta txn
versions already hold it: a run died between two commits), done (its "done" row). The tables asked are those
the registry lists for the stream and those its earlier outcome rows name; before any batch of the stream
finished, every table of the lake.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake.exceptions import DeltaError

from engagement_platform.lake.checkpoints import (
    BATCH,
    CHECKPOINTS,
    PLAN,
    planned_at_in,
    plans_from_rows,
    states_from_rows,
)
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.file_writes import filesystem
from engagement_platform.status.report import UNAVAILABLE, Batch, Lag, Service, batch_state, planned_lag, why
from engagement_platform.status.streams import StreamRef
from engagement_platform.streams.planning import BatchPlan, KafkaSlice

T = TypeVar("T")


class LakeReads:
    """Reads of the lake; after the first that fails, the others return their default at once."""

    def __init__(self, lake: DeltaLake):
        self.lake = lake
        self.error: str | None = None

    def guarded(self, read: Callable[[], T], default: T) -> T:
        if self.error is not None:
            return default
        try:
            return read()
        except (DeltaError, OSError) as e:
            self.error = why(e)
            return default

    @property
    def service(self) -> Service:
        return Service("lake", self.error is None, self.error or self.lake.root)

    def stream_names(self) -> set[str]:
        """Every stream the checkpoint store has rows of: its partition values, from the log alone."""
        if not self.lake.exists(CHECKPOINTS.name):
            return set()
        return {p["stream"] for p in self.lake.table(CHECKPOINTS.name).partitions()}

    def tables(self) -> list[str]:
        """Every Delta table of the lake: top-level folders, and one level deeper (profile_raw/<tenant>)."""
        fs, root = filesystem(self.lake.root, self.lake.storage_options)
        found = []
        for top in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
            if top.type != pafs.FileType.Directory or top.base_name.startswith(("_", ".")):
                continue
            if self.lake.exists(top.base_name):
                found.append(top.base_name)
                continue
            for inner in fs.get_file_info(pafs.FileSelector(top.path, allow_not_found=True)):
                name = f"{top.base_name}/{inner.base_name}"
                if inner.type == pafs.FileType.Directory and self.lake.exists(name):
                    found.append(name)
        return sorted(t for t in found if t != CHECKPOINTS.name)

    def committed_tables(self, ref: StreamRef, rows: pa.Table, batch_id: int) -> tuple[str, ...]:
        """The tables whose txn version of the stream's app id already covers `batch_id`."""
        if ref.app_id is None:
            return ()
        outcomes = set(rows["process"].to_pylist()) - {PLAN, BATCH}
        # Before the stream's first outcome rows, a table the registry does not list may hold the batch too.
        candidates = sorted(outcomes | set(ref.tables) | (set() if outcomes else set(self.tables())))
        committed = []
        for table in candidates:
            if self.lake.exists(table):
                version = self.lake.committed_version(table, ref.app_id)
                if version is not None and version >= batch_id:
                    committed.append(table)
        return tuple(committed)


@dataclass(frozen=True)
class Latest:
    batch: Batch | str
    plan: BatchPlan | None = None


def latest_batch(reads: LakeReads, ref: StreamRef, rows: pa.Table | None) -> Latest:
    """The stream's latest batch from its checkpoint rows (None: the store did not answer)."""
    if rows is None:
        return Latest(UNAVAILABLE)
    mine = rows.filter(pc.equal(rows["stream"], ref.name))
    plans = plans_from_rows(ref.name, mine)
    if not plans:
        return Latest(Batch(None, batch_state(False, False, ())))
    plan = plans[-1]
    done = states_from_rows(mine, plan.batch_id).get(BATCH) == "done"
    none: tuple[str, ...] = ()
    tables = none if done else reads.guarded(lambda: reads.committed_tables(ref, mine, plan.batch_id), none)
    records = plan.record_count if isinstance(plan.slice, KafkaSlice) else None
    return Latest(
        Batch(plan.batch_id, batch_state(done, True, tables), tables, planned_at_in(mine, plan.batch_id), records),
        plan,
    )


@dataclass(frozen=True)
class ProcessorFacts:
    """What the processor's sensor sees per tenant: replication lag, and the staging span left to merge."""

    lags: dict = field(default_factory=dict)  # tenant -> profiles.lag.TenantLag
    spans: dict[str, str] = field(default_factory=dict)  # tenant with unmerged staging -> "<after>-<up to>"


def processor_facts(lake: DeltaLake) -> ProcessorFacts:
    from engagement_platform.profiles.lag import tenant_lags
    from engagement_platform.profiles.processor.progress import latest_progress, unprocessed_tenants
    from engagement_platform.profiles.tables import PROFILE_CDC_STAGING

    if not lake.exists(PROFILE_CDC_STAGING.name):
        return ProcessorFacts()
    current = lake.table(PROFILE_CDC_STAGING.name).version()
    progress = {t: r["staging_version"] for t, r in latest_progress(lake).items()}
    spans = {t: f"{progress.get(t, -1)}-{current}" for t in unprocessed_tenants(lake)}
    return ProcessorFacts(tenant_lags(lake), spans)


def tenant_lag(facts: ProcessorFacts | None, ref: StreamRef, batch: Batch | str, now: datetime) -> Lag:
    """A processor tenant's lag as the lag check measures it; any other non-Kafka stream's from its unfinished
    batch's plan (none once its latest batch is done: such a source has no backlog count status could read)."""
    if ref.family == "profile_processor":
        if facts is None:
            return Lag(UNAVAILABLE, None, UNAVAILABLE)
        lag = facts.lags.get(ref.tenant)
        if lag is not None:
            return Lag(
                lag.staged_unprocessed, None, lag.replication_lag_seconds, "CDC times (newest staged - newest merged)"
            )
    return planned_lag(batch, now, None) if isinstance(batch, Batch) else Lag(None, None, UNAVAILABLE)
