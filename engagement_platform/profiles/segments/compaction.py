"""Compaction of segment membership: a tenant's change log folded into its base, under the tenant's lock,
exactly once.

plan     on the driver, per tenant: the base's live files, the log files holding batches after the base's
         compaction point (`through`), and the highest batch among them, the new point. A tenant whose log
         holds nothing after its point is left alone.
compute  one Spark task per tenant (several tenants share one Spark job): the base and those log rows merged
         (current.py), written sorted by identity then segment in row groups of ROW_GROUP_ROWS (an identity's
         rows side by side: its column is runs that cost little to read, and an evaluation narrowing to a few
         identities compares a few hundred dictionary values per group), with the file's members per
         segment in its footer (stored.sizes_footer); only file actions and counts come back.
commit   one commit of `profile_segments` replacing each tenant's base files, carrying a txn per tenant
         (compaction_app_id(tenant), the new point): a re-run after that commit finds the txn and writes
         nothing; files of an attempt that died before it are deleted first. The log is not touched: it is
         the change feed activation reads, and erasure removes a person from both tables.

Under the tenant lock because erasure rewrites both tables under it: a compaction that read a log row an
erasure then removed would otherwise write the person back into the base.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

import pyarrow as pa
from pyspark.sql import SparkSession

from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.lake.file_writes import (
    WrittenFile,
    commit_files_of_batches,
    delete_uncommitted,
    tagged_batch,
    write_files,
    writer_tag,
)
from engagement_platform.lake.row_erasure import live_files
from engagement_platform.profiles.locks import tenant_locks
from engagement_platform.profiles.segments.columns import constant
from engagement_platform.profiles.segments.current import current_membership
from engagement_platform.profiles.segments.membership_files import MembershipFiles, compaction_app_id
from engagement_platform.profiles.segments.stored import read_stored, sizes_footer
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENTS
from engagement_platform.spark.handoff import HANDOFF_SCHEMA, collect_handoff, handoff
from engagement_platform.streams.batch import active_lease, failpoint
from engagement_platform.streams.coordinator import Coordinator

COMPACTION = "profile_segments_compaction"  # lock owner, and the failpoints' stream name (crash tests)
ROW_GROUP_ROWS = 65_536
COUNTS_SCHEMA = pa.schema(
    [("tenant", pa.string()), ("base_rows", pa.int64()), ("log_rows", pa.int64()), ("members", pa.int64())]
)
FILES_SCHEMA = pa.schema([("tenant", pa.string()), ("file", pa.string())])


@dataclass(frozen=True)
class CompactionWork:
    """One tenant's compaction, planned by the driver."""

    tenant: str
    base_files: tuple[str, ...]
    log_files: tuple[str, ...]
    through: int  # the base's current point
    up_to: int  # the new point: the highest batch in `log_files`
    base_uri: str
    tag: str


@dataclass
class Compacted:
    tenant: str
    through_before: int
    through: int
    base_rows: int = 0  # rows of the base before
    log_rows: int = 0  # log rows folded in
    members: int = 0  # rows of the new base
    version: int | None = None  # the commit; None when an earlier attempt had committed it
    seconds: dict[str, float] = field(default_factory=dict)

    def metadata(self) -> dict:
        return {
            "tenant": self.tenant,
            "through_before": self.through_before,
            "through": self.through,
            "base_rows_before": self.base_rows,
            "log_rows_folded": self.log_rows,
            "members": self.members,
            **({"profile_segments_version": self.version} if self.version is not None else {}),
            **{f"seconds_{k}": round(v, 3) for k, v in self.seconds.items()},
        }


def log_rows_pending(lake: DeltaLake, tenants: list[str]) -> dict[str, int]:
    """Per tenant, the log rows a compaction would fold in now (from the files' statistics)."""
    stored = MembershipFiles(lake)
    return {tenant: stored.of(tenant).log_rows for tenant in tenants}


def compact_work(work: CompactionWork, storage_options: Mapping[str, str] | None) -> tuple[dict, list[WrittenFile]]:
    """(counts, the new base's files) of one tenant: executor side."""
    stored = read_stored(work.base_files, work.log_files, storage_options, after_batch=work.through, encoded=True)
    members = current_membership(stored.base, stored.log)
    rows = members.append_column("tenant", constant(work.tenant, pa.string(), members.num_rows))
    files = (
        write_files(
            work.base_uri,
            PROFILE_SEGMENTS,
            rows,
            work.tag,
            storage_options,
            row_group_size=ROW_GROUP_ROWS,
            footer=sizes_footer(members["segment"]),
        )
        if rows.num_rows
        else []
    )
    counts = {
        "tenant": work.tenant,
        "base_rows": stored.base.num_rows,
        "log_rows": stored.log.num_rows,
        "members": members.num_rows,
    }
    return counts, files


def compaction_task(works: list[CompactionWork], storage_options: Mapping[str, str] | None):
    """The mapInArrow function over spark.range(len(works)): each row's task compacts that tenant."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                work = works[index]
                counts, files = compact_work(work, storage_options)
                yield from handoff("counts", pa.Table.from_pylist([counts], schema=COUNTS_SCHEMA))
                rows = [{"tenant": work.tenant, "file": f.to_json()} for f in files]
                yield from handoff("files", pa.Table.from_pylist(rows, schema=FILES_SCHEMA))

    return run


def dead_attempt(tenant: str, through: int):
    """Whether a base file's name says a compaction past `through` wrote it: one that never committed."""

    def written_by(name: str) -> bool:
        batch = tagged_batch(name, compaction_app_id(tenant))
        return batch is not None and batch > through

    return written_by


def plan_compactions(lake: DeltaLake, tenants: list[str]) -> tuple[list[CompactionWork], dict[str, list[WrittenFile]]]:
    """(the work of each tenant with log rows after its point, each tenant's live base files)."""
    stored = MembershipFiles(lake)
    live: dict[str, list[WrittenFile]] = {}
    for f in live_files(lake, PROFILE_SEGMENTS):
        live.setdefault(f.partition_values.get("tenant"), []).append(f)
    root = lake.uri(PROFILE_SEGMENTS.name).rstrip("/")
    works = []
    for tenant in tenants:
        files = stored.of(tenant)
        if not files.log:
            continue
        up_to = stored.highest_batch(tenant)
        tag = writer_tag(compaction_app_id(tenant), up_to)
        # what dead attempts wrote, whatever point they aimed at (more log may have come since): files of a
        # point past the base's are never committed ones, and they would hold people an erasure never reaches
        delete_uncommitted(lake, PROFILE_SEGMENTS, tag, {"tenant": tenant}, dead_attempt(tenant, files.through))
        works.append(
            CompactionWork(
                tenant,
                tuple(f"{root}/{unquote(f.path)}" for f in live.get(tenant, [])),
                files.log,
                files.through,
                up_to,
                lake.uri(PROFILE_SEGMENTS.name),
                tag,
            )
        )
    return works, live


def compact_tenants(
    spark: SparkSession,
    lake: DeltaLake,
    tenants: list[str],
    coordinator: Coordinator | None = None,
    owner: str = COMPACTION,
) -> list[Compacted]:
    """Fold each tenant's log into its base (tenants whose log holds nothing new are skipped), holding the
    tenants' locks from the plan to the commit."""
    lake.ensure(PROFILE_SEGMENTS)
    with tenant_locks(coordinator, tenants, owner):
        t0 = time.perf_counter()
        works, live = plan_compactions(lake, tenants)
        if not works:
            return []
        t1 = time.perf_counter()
        task = compaction_task(works, lake.storage_options)
        handed = collect_handoff(spark.range(len(works), numPartitions=len(works)).mapInArrow(task, HANDOFF_SCHEMA))
        t2 = time.perf_counter()
        failpoint(COMPACTION, "files")
        counts = {r["tenant"]: r for r in handed.get("counts", COUNTS_SCHEMA.empty_table()).to_pylist()}
        written: dict[str, list[WrittenFile]] = {w.tenant: [] for w in works}
        for r in handed.get("files", FILES_SCHEMA.empty_table()).to_pylist():
            written[r["tenant"]].append(WrittenFile.from_json(r["file"]))
        parts = [
            (BatchTxn(compaction_app_id(w.tenant), w.up_to), written[w.tenant], live.get(w.tenant, [])) for w in works
        ]
        lease = active_lease()
        if lease is not None:  # a lock lost while the tasks ran (a ZooKeeper session expired) stops the commit
            lease.check()
        version, fresh = commit_files_of_batches(lake, PROFILE_SEGMENTS, parts, {"upkeep": "segments compaction"})
        failpoint(COMPACTION, PROFILE_SEGMENTS.name)
        seconds = {"plan": t1 - t0, "compact": t2 - t1, "commit": time.perf_counter() - t2}
    return [
        Compacted(
            w.tenant,
            w.through,
            w.up_to,
            counts[w.tenant]["base_rows"],
            counts[w.tenant]["log_rows"],
            counts[w.tenant]["members"],
            version if new else None,
            seconds,
        )
        for w, new in zip(works, fresh)
    ]
