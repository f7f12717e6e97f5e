"""Staged changes + current raw rows -> the MERGE source of each tenant, on Spark.

Both entry points hand each tenant's changes and stored rows to one call of
tenant_merge.tenant_merge_source (json_merge's rules per key, then the identity graph, then the
promoted columns) in a Python worker:

- merge_sources_to_files (the processor): one task of the `profile_merge` data source per tenant
  reads the tenant's staged and raw files itself (no shuffle) and hands its MERGE source over in a file.
- merge_source (the backfill, whose changes are snapshot rows in a DataFrame): the stored rows the
  batch can affect (affected_rows) cogrouped with the changes by tenant (applyInArrow).

MERGE source rows carry `_action`: `upsert` (a whole new row, tombstones included) or `relink`
(only related_ids / component_id of a row the batch did not change).

Why not Spark column expressions: the fold needs a map<string,variant> per change and stored row
(map_zip_with, to_json) and connected components a second grouped job; that plan costs most of a
batch's time (BENCHMARKS.md).
"""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from engagement_platform.lake.suppression import Suppressed
from engagement_platform.profiles.processor.merge_source import ProfileMergeDataSource
from engagement_platform.profiles.processor.tenant_merge import (
    ACTION,
    CHANGE_COLUMNS,
    RELINK,
    SOURCE_DDL,
    SOURCE_SCHEMA,
    STORED_COLUMNS,
    UPSERT,
    tenant_merge_source,
)
from engagement_platform.spark.session import register_data_source

__all__ = ["ACTION", "RELINK", "UPSERT"]
KEY = ["tenant", "primary_id"]
STAGED_DDL = (
    "primary_id string, related_ids array<string>, record_type string, op string, cdc_seq bigint, "
    "cdc_ts timestamp, fields string"
)
RAW_DDL = (
    "tenant string, primary_id string, record_type string, linked_ids array<string>, related_ids array<string>, "
    "component_id string, cdc_seq bigint, cdc_ts timestamp, deleted boolean, fields string, email string, "
    "country string, updated_at timestamp, batch_id bigint, processed_at timestamp"
)
SOURCE_COLUMNS = tuple(SOURCE_SCHEMA.names)


def _no_ids():
    return F.array().cast("array<string>")


FILE_PATH = "_file_path"


def with_partition_values(staged_files: DataFrame) -> DataFrame:
    """Staging partition values are in the file paths only (Delta keeps them out of the files): `staged_files`
    comes from snapshots.read_files(..., path_column=FILE_PATH)."""
    path = F.col(FILE_PATH)
    return staged_files.select(
        F.regexp_extract(path, "/tenant=([^/]+)/", 1).alias("tenant"),
        F.regexp_extract(path, "/bucket=([^/]+)/", 1).alias("bucket"),
        *[F.col(c.split()[0]) for c in STAGED_DDL.split(", ")],
    )


def batch_stats(staged: DataFrame) -> DataFrame:
    """Per tenant: changes read, last bucket, newest CDC timestamp and sequence (the progress row)."""
    return staged.groupBy("tenant").agg(
        F.count(F.lit(1)).alias("changes_read"),
        F.max("bucket").alias("last_bucket"),
        F.max("cdc_ts").alias("max_cdc_ts"),
        F.max("cdc_seq").alias("max_cdc_seq"),
    )


def _ids_named(links: str) -> Column:
    return F.explode(F.array_union(F.array("primary_id"), F.coalesce(links, _no_ids())))


def affected_rows(staged: DataFrame, raw: DataFrame) -> DataFrame:
    """Stored rows of the ids the batch names (its keys and every id any change links to) and of every
    component holding one: a superset of what the batch can change, closed under components (a row's
    related_ids hold its whole component, so if one row of a component is in, all are)."""
    named = staged.select("tenant", _ids_named("related_ids").alias("id")).distinct()
    members = raw.select(*KEY, _ids_named("related_ids").alias("id"))
    wanted = members.join(named, ["tenant", "id"], "left_semi").select(*KEY).distinct()
    return raw.join(wanted, KEY, "left_semi")


def merge_source(staged: DataFrame, raw: DataFrame) -> DataFrame:
    """MERGE source rows (SOURCE_COLUMNS) of every tenant in `staged` from DataFrames (the backfill's
    snapshot rows); `raw` holds those tenants' rows. Stored rows are pruned to affected_rows first."""
    changes = staged.select(*CHANGE_COLUMNS).groupBy("tenant")
    stored = affected_rows(staged, raw).select(*STORED_COLUMNS).groupBy("tenant")
    return changes.cogroup(stored).applyInArrow(tenant_merge_source, schema=SOURCE_DDL)


def suppressed_option(suppressed: Suppressed | None, tenants: list[str]) -> str:
    """The tenants' suppression lists for the tasks (the backstop behind the dumper: a change staged by a
    dumper batch that raced an erasure is dropped here, before it can be merged)."""
    by_tenant = {t: sorted(suppressed.by_scope[t]) for t in tenants if suppressed and suppressed.by_scope.get(t)}
    return json.dumps({"secret": suppressed.secret.hex(), "by_tenant": by_tenant} if by_tenant else {})


def merge_sources_to_files(
    spark: SparkSession,
    files: dict[str, tuple[list[str], list[str]]],
    handoff: str,
    storage_options: dict[str, str] | None = None,
    suppressed: Suppressed | None = None,
) -> DataFrame:
    """merge_source for the processor, whose inputs are files: {tenant: (staged file uris, raw file
    uris)}. Each tenant is read and folded in one task of the `profile_merge` data source
    (merge_source.py, registered here), with no shuffle, and its MERGE source written to an Arrow file
    under `handoff` (an absolute path or URI). Returns one row per tenant: tenant, file, rows."""
    register_data_source(spark, ProfileMergeDataSource)
    tenants = {t: {"staged": staged, "raw": raw} for t, (staged, raw) in files.items()}
    return (
        spark.read.format("profile_merge")
        .option("tenants", json.dumps(tenants))
        .option("handoff", handoff)
        .option("storage_options", json.dumps(storage_options or {}))
        .option("suppressed", suppressed_option(suppressed, list(files)))
        .load()
    )
