"""Spark Python data source `profile_merge`: each tenant's MERGE source, computed where its files are read.

The processor's batch is a list of tenants, each with its staged files (the slice of profile_cdc_staging
it merges) and its raw table's files. Each tenant is one input partition: an executor's Python worker
reads the tenant's parquet files with pyarrow and runs tenant_merge.tenant_merge_source on them, so
the rows go from storage straight into the fold. Compared with the same fold behind a Spark cogroup
(parquet read in the JVM, shuffle and sort by tenant, Arrow to the worker), this skips the shuffle and
one copy of every row.

The task writes its tenant's MERGE source as an Arrow IPC file under the `handoff` directory and
returns one row (tenant, file, rows); the driver reads the files for delta-rs's MERGE. This is how
Spark's own writers work (tasks write files, the driver commits), and it spares the rows a trip
through the JVM (Arrow -> rows -> Arrow) and the Spark Connect stream (BENCHMARKS.md has the figures).

Files are read as delta-rs wrote them (no deletion vectors, no column mapping: snapshots.py); staged
files keep the tenant in their path, not in the rows. Files and the handoff directory go through
pyarrow's filesystems with the lake's storage options, which travel in the source's options; a credential
they lack comes from the executor node's default chain (docs/operations/deploy.md).
"""

from __future__ import annotations

import json

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

HANDOFF_DDL = "tenant string, file string, rows bigint"


class TenantFiles(InputPartition):
    def __init__(self, tenant: str, staged: list[str], raw: list[str]):
        self.tenant, self.staged, self.raw = tenant, staged, raw


class ProfileMergeDataSource(DataSource):
    """Options: `tenants`, JSON {tenant: {"staged": [file uri, ...], "raw": [file uri, ...]}};
    `handoff`, the directory (absolute path or URI) the MERGE sources are written to."""

    @classmethod
    def name(cls) -> str:
        return "profile_merge"

    def schema(self) -> str:
        return HANDOFF_DDL

    def reader(self, schema) -> DataSourceReader:
        return ProfileMergeReader(
            json.loads(self.options["tenants"]),
            self.options["handoff"],
            json.loads(self.options.get("storage_options") or "{}"),
            json.loads(self.options.get("suppressed") or "{}"),
        )


class ProfileMergeReader(DataSourceReader):
    def __init__(
        self,
        tenants: dict[str, dict[str, list[str]]],
        handoff: str,
        storage_options: dict[str, str] | None = None,
        suppressed: dict | None = None,
    ):
        self.tenants, self.handoff = tenants, handoff.rstrip("/")
        self.suppressed = (
            suppressed or {}
        )  # {"secret": hex, "by_tenant": {tenant: [hash, ...]}} (resolution.suppressed_option)
        self.storage_options = (
            storage_options or None
        )  # the lake's, from the driver: executors do not share its environment

    def partitions(self):
        # Biggest first, so the last task to start is a small one and both cores finish together.
        order = sorted(self.tenants, key=lambda t: -len(self.tenants[t]["staged"]))
        return [TenantFiles(t, self.tenants[t]["staged"], self.tenants[t]["raw"]) for t in order]

    def read(self, part: TenantFiles):
        from engagement_platform.profiles.processor.tenant_merge import read_tenant_files, tenant_merge_source
        from engagement_platform.spark.handoff_files import write_handoff

        changes, stored = read_tenant_files(part.tenant, part.staged, part.raw, self.storage_options)
        hashes = self.suppressed.get("by_tenant", {}).get(part.tenant)
        if hashes:  # changes naming an erased identity are never merged
            from engagement_platform.lake.suppression import Suppressed
            from engagement_platform.profiles.suppressed import drop_suppressed_changes

            changes, _ = drop_suppressed_changes(
                changes, Suppressed(bytes.fromhex(self.suppressed["secret"]), {part.tenant: frozenset(hashes)})
            )
        source = tenant_merge_source(changes, stored)
        file = f"{self.handoff}/{part.tenant}.arrow"  # tenant names are safe file names (records.py)
        write_handoff(file, source, self.storage_options)
        yield part.tenant, file, source.num_rows
