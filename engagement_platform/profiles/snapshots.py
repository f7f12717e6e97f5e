"""Delta snapshots as file lists, so Spark reads the lake's parquet files itself.

Spark has no Delta reader here (no delta-spark jars), and shipping rows from the client over Spark
Connect is slow, so Spark reads the data files of a delta-rs snapshot directly. That is exact for
tables delta-rs writes (no deletion vectors, no column mapping). Rows staged after version V are the
files of the current snapshot that were not in snapshot V: staging is append-only, and is never
compacted (a compaction would make old rows look new; the processor would then skip them as stale).
"""

from __future__ import annotations

import re

from pyspark.sql import DataFrame, SparkSession

from engagement_platform.lake.delta import DeltaLake

_TENANT_DIR = re.compile(r"/tenant=([^/]+)/")


def tenant_files(lake: DeltaLake, name: str, tenant: str, version: int | None = None) -> set[str]:
    table = lake.table(name, version=version)
    return set(table.file_uris(partition_filters=[("tenant", "=", tenant)]))


def files_by_tenant(lake: DeltaLake, name: str, version: int | None = None) -> dict[str, set[str]]:
    """tenant -> data files of the snapshot, from one listing (tenant names need no escaping in paths)."""
    out: dict[str, set[str]] = {}
    for uri in lake.table(name, version=version).file_uris():
        match = _TENANT_DIR.search(uri)
        if match:
            out.setdefault(match.group(1), set()).add(uri)
    return out


def files_added(lake: DeltaLake, name: str, tenant: str, after_version: int, up_to_version: int) -> list[str]:
    """Data files of `tenant` committed in versions (after_version, up_to_version] of an append-only table."""
    if up_to_version <= after_version:
        return []
    now = tenant_files(lake, name, tenant, up_to_version)
    before = tenant_files(lake, name, tenant, after_version) if after_version >= 0 else set()
    return sorted(now - before)


def table_files(lake: DeltaLake, name: str) -> list[str]:
    return lake.table(name).file_uris() if lake.exists(name) else []


def read_files(spark: SparkSession, uris: list[str], ddl: str) -> DataFrame:
    """The files as one DataFrame with schema `ddl` (an empty one when there are none)."""
    if not uris:
        return spark.createDataFrame([], ddl)
    return spark.read.schema(ddl).parquet(*uris)
