"""Spark Python data source `profile_merge`: each tenant's MERGE source, computed where its files are read.

The processor's batch is a list of tenants, each with its staged files (the slice of profile_cdc_staging
it merges) and its raw table's files. Each tenant is one input partition: an executor's Python worker
reads the tenant's parquet files with pyarrow and runs tenant_merge.tenant_merge_source on them, so
the rows go from storage straight into the fold. Measured against the same fold behind a Spark cogroup
(parquet read in the JVM, shuffle and sort by tenant, Arrow to the worker: BENCHMARKS.md, issue 6),
this skips the shuffle and one copy of every row.

Files are read as delta-rs wrote them (no deletion vectors, no column mapping: snapshots.py); staged
files keep the tenant in their path, not in the rows.
"""

from __future__ import annotations

import json

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition


class TenantFiles(InputPartition):
    def __init__(self, tenant: str, staged: list[str], raw: list[str]):
        self.tenant, self.staged, self.raw = tenant, staged, raw


class ProfileMergeDataSource(DataSource):
    """Option `tenants`: JSON {tenant: {"staged": [file uri, ...], "raw": [file uri, ...]}}."""

    @classmethod
    def name(cls) -> str:
        return "profile_merge"

    def schema(self) -> str:
        from engagement_platform.profiles.tenant_merge import SOURCE_DDL

        return SOURCE_DDL

    def reader(self, schema) -> DataSourceReader:
        return ProfileMergeReader(json.loads(self.options["tenants"]))


class ProfileMergeReader(DataSourceReader):
    def __init__(self, tenants: dict[str, dict[str, list[str]]]):
        self.tenants = tenants

    def partitions(self):
        # Biggest first, so the last task to start is a small one and both cores finish together.
        order = sorted(self.tenants, key=lambda t: -len(self.tenants[t]["staged"]))
        return [TenantFiles(t, self.tenants[t]["staged"], self.tenants[t]["raw"]) for t in order]

    def read(self, part: TenantFiles):
        from engagement_platform.profiles.tenant_merge import read_tenant_files, tenant_merge_source

        changes, stored = read_tenant_files(part.tenant, part.staged, part.raw)
        yield from tenant_merge_source(changes, stored).to_batches()
