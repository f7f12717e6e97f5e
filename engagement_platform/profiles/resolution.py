"""The processor's Spark plan: staged changes + current raw rows -> the MERGE source of each tenant.

Spark reads the staged changes and the raw rows, keeps only the stored rows the batch can affect (the
rows of the batch's ids and of every component holding one of the ids the batch names), and hands
each tenant's changes and stored rows to one call of tenant_merge.tenant_merge_source in a Python
worker (cogroup by tenant, applyInArrow): json_merge's rules per key, then the identity graph. The
promoted columns are read from the merged JSON back in Spark, with the same expressions staging uses.

MERGE source rows carry `_action`: `upsert` (a whole new row, tombstones included) or `relink`
(only related_ids / component_id of a row the batch did not change).

Before, the fold ran as Spark column expressions (map<string,variant> per change and stored row,
map_zip_with, to_json) and connected components as a second grouped job; on 2 cores that plan was
most of a batch's time (BENCHMARKS.md, issue 6).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from engagement_platform.profiles.records import promoted_columns
from engagement_platform.profiles.tenant_merge import (
    ACTION, CHANGE_COLUMNS, RELINK, SOURCE_DDL, STORED_COLUMNS, UPSERT, tenant_merge_source,
)

__all__ = ["ACTION", "RELINK", "UPSERT"]
KEY = ["tenant", "primary_id"]
STAGED_DDL = ("primary_id string, related_ids array<string>, record_type string, op string, cdc_seq bigint, "
              "cdc_ts timestamp, fields string")
RAW_DDL = ("tenant string, primary_id string, record_type string, linked_ids array<string>, related_ids array<string>, "
           "component_id string, cdc_seq bigint, cdc_ts timestamp, deleted boolean, fields string, email string, "
           "country string, updated_at timestamp, batch_id bigint, processed_at timestamp")
SOURCE_COLUMNS = ("tenant", "primary_id", "record_type", "linked_ids", "related_ids", "component_id", "cdc_seq", "cdc_ts",
                  "deleted", "fields", "email", "country", "updated_at", ACTION)


def _no_ids():
    return F.array().cast("array<string>")


def with_partition_values(staged_files: DataFrame) -> DataFrame:
    """Staging partition values are in the file paths only (Delta keeps them out of the files)."""
    path = F.col("_metadata.file_path")
    return staged_files.select(F.regexp_extract(path, "/tenant=([^/]+)/", 1).alias("tenant"),
                               F.regexp_extract(path, "/bucket=([^/]+)/", 1).alias("bucket"),
                               *[F.col(c.split()[0]) for c in STAGED_DDL.split(", ")])


def batch_stats(staged: DataFrame) -> DataFrame:
    """Per tenant: changes read, last bucket, newest CDC timestamp and sequence (the progress row)."""
    return staged.groupBy("tenant").agg(F.count(F.lit(1)).alias("changes_read"), F.max("bucket").alias("last_bucket"),
                                        F.max("cdc_ts").alias("max_cdc_ts"), F.max("cdc_seq").alias("max_cdc_seq"))


def _ids_named(links: str) -> Column:
    return F.explode(F.array_union(F.array("primary_id"), F.coalesce(links, _no_ids())))


# Pruning the stored rows in Spark costs a scan, an explode and a join; shipping the ones it would drop
# to the Python workers costs their transfer. Measured on the benchmark's 1.7M changes over 1.2M
# stored rows (BENCHMARKS.md), the pruning alone took 11.7 s against 7.7 s for the whole unpruned
# pass, so a batch prunes only when its changes are under a tenth of the stored rows, and then
# broadcasts the ids it names (no shuffle) while they are few enough to.
PRUNE_RATIO = 10
BROADCAST_MAX_IDS = 1_000_000


def pruning(changes: int, stored_rows: int) -> tuple[bool, bool]:
    """(prune the stored rows in Spark, broadcast the batch's ids to do it) for a batch of `changes`."""
    prune = changes * PRUNE_RATIO < stored_rows
    return prune, prune and changes <= BROADCAST_MAX_IDS


def affected_rows(staged: DataFrame, raw: DataFrame, broadcast: bool = False) -> DataFrame:
    """Stored rows of the ids the batch names (its keys and every id any change links to) and of every
    component holding one: a superset of what the batch can change, closed under components (a row's
    related_ids hold its whole component, so if one row of a component is in, all are)."""
    named = staged.select("tenant", _ids_named("related_ids").alias("id"))
    named = F.broadcast(named) if broadcast else named.distinct()
    members = raw.select(*KEY, _ids_named("related_ids").alias("id"))
    wanted = members.join(named, ["tenant", "id"], "left_semi").select(*KEY).distinct()
    return raw.join(wanted, KEY, "left_semi")


def merge_source(staged: DataFrame, raw: DataFrame, prune: bool = True, broadcast: bool = False) -> DataFrame:
    """MERGE source rows (SOURCE_COLUMNS) of every tenant in `staged`; `raw` holds those tenants' rows
    (all of them, or with `prune` any superset of affected_rows: tenant_merge finds the affected ones)."""
    changes = staged.select(*CHANGE_COLUMNS).groupBy("tenant")
    stored = (affected_rows(staged, raw, broadcast) if prune else raw).select(*STORED_COLUMNS).groupBy("tenant")
    source = changes.cogroup(stored).applyInArrow(tenant_merge_source, schema=SOURCE_DDL)
    promoted = promoted_columns(F.col("fields"))
    return source.select(*[promoted[c].alias(c) if c in promoted else F.col(c) for c in SOURCE_COLUMNS])
