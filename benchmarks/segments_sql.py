"""The segments benchmark's baseline: one segment as one Spark SQL query (what a user without the platform's
one-pass evaluator would run per segment). Its membership must equal the platform's.

The query reads the raw rows, parses the JSON payload with `try_parse_json` (VARIANT), groups by (tenant,
component_id) and evaluates the segment's condition as one aggregate expression. The comparison rules of
definitions.py are kept: a value of another kind than the literal (schema_of_variant) or a missing one
makes a comparison false. Profile values (the newest record that has the path) use max_by over cdc_ts,
which needs distinct cdc_ts within an identity (the benchmark's data has them).
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from engagement_platform.profiles.segments.columns import TIME_PATHS, time_us
from engagement_platform.profiles.segments.definitions import (
    Aggregate,
    AllOf,
    AnyOf,
    Cmp,
    HasType,
    Ids,
    Not,
    Profile,
    Segment,
)
from engagement_platform.profiles.segments.evaluate import kind_of

NUMBER_TYPES = "('BIGINT', 'INT', 'SMALLINT', 'TINYINT', 'DOUBLE', 'FLOAT')"


def literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(float(value))
    if isinstance(value, datetime):
        return str(time_us(value))
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


class Value:
    """How one path reads in SQL: presence, and the value by kind (None: the path never has that kind)."""

    def __init__(self, path: str):
        if path.startswith("fields."):
            json_path = "$" + "".join("['" + key.replace("'", "\\'") + "']" for key in path.split(".")[1:])
            quoted = literal(json_path)
            node = f"variant_get(v, {quoted}, 'variant')"
            kind = f"schema_of_variant({node})"
            self.present = f"({node} IS NOT NULL AND NOT is_variant_null({node}))"
            self.by_kind = {
                "str": (f"{kind} = 'STRING'", f"try_variant_get(v, {quoted}, 'string')"),
                "number": (
                    f"({kind} IN {NUMBER_TYPES} OR {kind} LIKE 'DECIMAL%')",
                    f"try_variant_get(v, {quoted}, 'double')",
                ),
                "bool": (f"{kind} = 'BOOLEAN'", f"try_variant_get(v, {quoted}, 'boolean')"),
            }
        elif path in TIME_PATHS:
            self.present = f"({path} IS NOT NULL)"
            self.by_kind = {"time": (self.present, f"unix_micros({path})")}
        else:
            self.present = f"({path} IS NOT NULL)"
            self.by_kind = {"str": (self.present, path)}


def compare(node: Cmp) -> str:
    value = Value(node.path)
    if node.op == "exists":
        return value.present
    if node.op == "in":
        return "(" + " OR ".join(compare(Cmp(node.path, "=", item)) for item in node.value) + ")"
    if node.op == "contains":
        if "str" not in value.by_kind:
            return "false"
        ok, text = value.by_kind["str"]
        return f"coalesce({ok} AND instr({text}, {literal(node.value)}) > 0, false)"
    kind = kind_of(node.value)
    if kind not in value.by_kind or (kind == "bool" and node.op not in ("=", "!=")):
        return "false"
    ok, typed = value.by_kind[kind]
    op = "<>" if node.op == "!=" else node.op
    return f"coalesce({ok} AND {typed} {op} {literal(node.value)}, false)"


def record(node) -> str:
    if isinstance(node, Cmp):
        return compare(node)
    if isinstance(node, Not):
        return f"(NOT {record(node.item)})"
    joiner = " AND " if isinstance(node, AllOf) else " OR "
    return "(" + joiner.join(record(item) for item in node.items) + ")"


def identity(node) -> str:
    if isinstance(node, Not):
        return f"(NOT {identity(node.item)})"
    if isinstance(node, (AllOf, AnyOf)):
        joiner = " AND " if isinstance(node, AllOf) else " OR "
        return "(" + joiner.join(identity(item) for item in node.items) + ")"
    if isinstance(node, HasType):
        return f"(max(CASE WHEN record_type = {literal(node.record_type)} THEN 1 ELSE 0 END) = 1)"
    if isinstance(node, Ids):
        return f"(count(DISTINCT primary_id) {'<>' if node.op == '!=' else node.op} {node.value})"
    if isinstance(node, Profile):
        present = Value(node.cmp.path).present
        return f"coalesce(max_by(CASE WHEN {present} THEN {compare(node.cmp)} END, CASE WHEN {present} THEN unix_micros(cdc_ts) END), false)"
    assert isinstance(node, Aggregate)
    chosen = record(node.where) if node.where is not None else "true"
    if node.within_s is not None:
        chosen = f"({chosen} AND ts_s >= now_s - {float(node.within_s)!r} AND ts_s <= now_s)"
    op = "<>" if node.op == "!=" else node.op
    if node.kind in ("count", "exists"):
        return f"(sum(CASE WHEN {chosen} THEN 1 ELSE 0 END) {op} {node.value})"
    kind = kind_of(node.value)
    value = Value(node.path)
    if kind not in value.by_kind or (kind == "bool" and node.op not in ("=", "!=")):
        return "false"
    ok, typed = value.by_kind[kind]
    return f"coalesce({node.kind}(CASE WHEN {chosen} AND {ok} THEN {typed} END) {op} {literal(node.value)}, false)"


def segment_query(raw: DataFrame, times: DataFrame, segment: Segment) -> DataFrame:
    """(tenant, identity) of every identity in the segment; `times` holds each tenant's evaluation time (now_s)."""
    rows = (
        raw.where("NOT coalesce(deleted, false)")
        .join(times, "tenant")
        .selectExpr("*", "try_parse_json(fields) AS v", "unix_micros(cdc_ts) / 1e6 AS ts_s")
    )
    inside = rows.groupBy("tenant", "component_id").agg(F.expr(identity(segment.where)).alias("inside"))
    return inside.where("inside").select("tenant", F.col("component_id").alias("identity"))
