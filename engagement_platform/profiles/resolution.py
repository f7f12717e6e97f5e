"""The processor's Spark plan: staged changes + current raw rows -> the MERGE source of each tenant.

Per (tenant, primary id), json_merge's rules as column expressions: changes sorted by CDC sequence,
those not above the stored row's sequence dropped (late or replayed), the fold restarted after the
last delete, fields folded in the JVM (map_zip_with). Then the identity graph: every stored row
whose component touches an id of the batch is re-labelled together with the batch's rows, so a new
link between two existing components relabels both, and a dropped link splits one.

MERGE source rows carry `_action`: `upsert` (a whole new row, tombstones included) or `relink`
(only related_ids / component_id of a row the batch did not change).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from engagement_platform.profiles.identity import connected_components
from engagement_platform.profiles.json_merge import DELETE, merged_fields_json
from engagement_platform.profiles.records import promoted_columns

ACTION, UPSERT, RELINK = "_action", "upsert", "relink"
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


def resolve_keys(staged: DataFrame, raw: DataFrame) -> DataFrame:
    """The new state of every key with at least one change newer than its stored row (no graph columns yet)."""
    change = F.struct("cdc_seq", "op", "cdc_ts", "record_type", "related_ids", "fields")
    per_key = staged.groupBy(*KEY).agg(F.array_sort(F.collect_list(change)).alias("cs"))
    # Only the stored rows of the batch's keys take part: a broadcast semi-join drops the others before
    # the join shuffles them (the batch's keys are a fraction of the raw rows).
    stored = raw.join(F.broadcast(per_key.select(*KEY)), KEY, "left_semi")
    old = stored.select(*KEY, *[F.col(c).alias(f"old_{c}") for c in ("cdc_seq", "deleted", "fields", "linked_ids", "record_type")])
    keyed = per_key.join(old, KEY, "left")
    fresh = F.filter("cs", lambda c: c["cdc_seq"] > F.coalesce(F.col("old_cdc_seq"), F.lit(-1)))
    keyed = keyed.withColumn("fresh", fresh).where(F.size("fresh") > 0)
    last_delete = F.aggregate("fresh", F.lit(None).cast("bigint"), lambda acc, c: F.when(c["op"] == DELETE, c["cdc_seq"]).otherwise(acc))
    keyed = keyed.withColumn("last_delete", last_delete)
    after = F.filter("fresh", lambda c: c["cdc_seq"] > F.coalesce(F.col("last_delete"), F.lit(-1)))
    alive = F.col("old_cdc_seq").isNotNull() & ~F.col("old_deleted") & F.col("last_delete").isNull()
    last = F.element_at("fresh", -1)
    deleted = last["op"] == DELETE
    linked = F.aggregate(after, F.when(alive, F.coalesce("old_linked_ids", _no_ids())).otherwise(_no_ids()),
                         lambda acc, c: F.coalesce(c["related_ids"], acc))
    fields = F.when(~deleted, merged_fields_json(F.when(alive, F.col("old_fields")), after))
    return keyed.select(
        *KEY,
        F.aggregate("fresh", F.col("old_record_type"), lambda acc, c: F.coalesce(c["record_type"], acc)).alias("record_type"),
        F.when(deleted, _no_ids()).otherwise(F.array_distinct(linked)).alias("linked_ids"),
        last["cdc_seq"].alias("cdc_seq"), last["cdc_ts"].alias("cdc_ts"), deleted.alias("deleted"), fields.alias("fields"),
    )


def _edges(rows: DataFrame) -> DataFrame:
    """(tenant, src, dst) of each row's links, plus a self-loop so a row without links is its own component."""
    ends = F.array_union(F.array(F.col("primary_id")), F.coalesce(F.col("linked_ids"), _no_ids()))
    return rows.select("tenant", F.col("primary_id").alias("src"), F.explode(ends).alias("dst"))


def merge_source(staged: DataFrame, raw: DataFrame) -> DataFrame:
    """MERGE source rows (SOURCE_COLUMNS) of every tenant in `staged`; `raw` holds those tenants' rows."""
    keys = resolve_keys(staged, raw)
    touched = keys.select("tenant", F.explode(F.array_union(F.array("primary_id"), "linked_ids")).alias("id")).distinct()
    members = raw.select(*KEY, F.explode(F.coalesce("related_ids", _no_ids())).alias("id"))
    affected = members.join(touched, ["tenant", "id"], "left_semi").select(*KEY).distinct()
    untouched = raw.join(affected, KEY, "left_semi").join(keys.select(*KEY), KEY, "left_anti")
    components = connected_components(_edges(untouched).unionByName(_edges(keys)))
    labels = components.withColumnRenamed("id", "primary_id")

    upserts = keys.join(labels, KEY, "left").select(
        *KEY, "record_type", "linked_ids", "related_ids", "component_id", "cdc_seq", "cdc_ts", "deleted", "fields",
        *[col.alias(name) for name, col in promoted_columns(F.col("fields")).items()], F.lit(UPSERT).alias(ACTION),
    )
    relabelled = untouched.select(*KEY, F.col("related_ids").alias("old_related"), F.col("component_id").alias("old_component")).join(labels, KEY)
    changed = ~_same(F.col("old_related"), F.col("related_ids")) | ~F.col("old_component").eqNullSafe(F.col("component_id"))
    relinks = relabelled.where(changed).select(*KEY, "related_ids", "component_id", F.lit(RELINK).alias(ACTION))
    return upserts.unionByName(relinks, allowMissingColumns=True).select(*SOURCE_COLUMNS)


def _same(a: Column, b: Column) -> Column:
    return F.coalesce(a == b, F.lit(False))
