"""Delta snapshots as file lists, so Spark reads the lake's parquet files itself.

Spark has no Delta reader here (no delta-spark jars), and shipping rows from the client over Spark
Connect is slow, so Spark reads the data files of a delta-rs snapshot directly. That is exact for
tables delta-rs writes (no deletion vectors, no column mapping). Rows staged after version V are the
files of the current snapshot that were not in snapshot V: staging is append-only, and is never
compacted (a compaction would make old rows look new; the processor would then skip them as stale).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.file_writes import filesystem, read_parquet
from engagement_platform.spark.handoff import dealt

_TENANT_DIR = re.compile(r"/tenant=([^/]+)/")


def files_by_tenant(lake: DeltaLake, name: str, version: int | None = None) -> dict[str, set[str]]:
    """tenant -> data files of the snapshot, from one listing (tenant names need no escaping in paths)."""
    out: dict[str, set[str]] = {}
    for uri in lake.table(name, version=version).file_uris():
        match = _TENANT_DIR.search(uri)
        if match:
            out.setdefault(match.group(1), set()).add(uri)
    return out


class SnapshotListings:
    """Data files per tenant of an append-only table's snapshots, each version listed once for every tenant."""

    def __init__(self, lake: DeltaLake, name: str):
        self.lake, self.name = lake, name
        self._by_version: dict[int, dict[str, set[str]]] = {}

    def files(self, version: int) -> dict[str, set[str]]:
        """tenant -> data files of snapshot `version` (-1: before the first commit, none)."""
        if version not in self._by_version:
            self._by_version[version] = files_by_tenant(self.lake, self.name, version) if version >= 0 else {}
        return self._by_version[version]

    def added(self, tenant: str, after_version: int, up_to_version: int) -> list[str]:
        """Data files of `tenant` committed in versions (after_version, up_to_version]."""
        if up_to_version <= after_version:
            return []
        return sorted(self.files(up_to_version).get(tenant, set()) - self.files(after_version).get(tenant, set()))


def table_files(lake: DeltaLake, name: str) -> list[str]:
    return lake.table(name).file_uris() if lake.exists(name) else []


READ_TASKS = 4  # Spark tasks that read an object store's files (each with its share of the files)


def read_files(
    spark: SparkSession,
    uris: list[str],
    ddl: str,
    storage_options: Mapping[str, str] | None = None,
    path_column: str | None = None,
) -> DataFrame:
    """The files as one DataFrame with schema `ddl` (an empty one when there are none), plus a string column
    `path_column` naming each row's file when asked (partition values live only in the paths). Local files
    go through Spark's Parquet reader; files on an object store through pyarrow in Spark tasks, with the
    lake's storage options, since Spark's own reader would need Hadoop's S3 / ABFS connectors (not installed
    here)."""
    ddl_out = f"{ddl}, `{path_column}` string" if path_column else ddl
    if not uris:
        return spark.createDataFrame([], ddl_out)
    if all("://" not in u or u.startswith("file://") for u in uris):
        files = spark.read.schema(ddl).parquet(*uris)
        return files.select("*", F.col("_metadata.file_path").alias(path_column)) if path_column else files
    struct = spark.createDataFrame([], ddl_out).schema
    schema = to_arrow_schema(struct, timezone="UTC")  # timestamps as Delta stores them: UTC instants
    shares = dealt(uris, READ_TASKS)

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column("id").to_pylist():
                for uri in shares[index]:
                    fs, path = filesystem(uri, storage_options)
                    rows = read_parquet(fs, path)
                    if path_column:
                        rows = rows.append_column(path_column, pa.array([uri] * rows.num_rows, pa.string()))
                    columns = [
                        rows[f.name].cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
                        for f in schema
                    ]
                    yield from pa.Table.from_arrays(columns, schema=schema).to_batches()

    return spark.range(len(shares), numPartitions=len(shares)).mapInArrow(read, struct)


def staged_stats(lake: DeltaLake, name: str, uris_by_tenant: dict[str, list[str]]) -> dict[str, dict] | None:
    """Per tenant, from the log's statistics of its files: changes (rows), last bucket, newest CDC
    timestamp and sequence (what the progress row records). None when a file lacks a statistic (a
    writer other than the dumper): then the caller reads the rows."""
    actions = pa.table(lake.table(name).get_add_actions(flatten=True))
    needed = ("num_records", "max.cdc_ts", "max.cdc_seq", "partition.bucket")
    if any(c not in actions.column_names for c in needed):
        return None
    by_path = dict(zip(actions["path"].to_pylist(), zip(*(actions[c].to_pylist() for c in needed))))
    out = {}
    for tenant, uris in uris_by_tenant.items():
        files = [by_path.get(uri.split(f"/{name}/", 1)[-1]) for uri in uris]
        if not files or any(f is None or None in f for f in files):
            return None
        out[tenant] = {
            "tenant": tenant,
            "changes_read": sum(f[0] for f in files),
            "max_cdc_ts": max(f[1] for f in files),
            "max_cdc_seq": max(f[2] for f in files),
            "last_bucket": max(f[3] for f in files),
        }
    return out
