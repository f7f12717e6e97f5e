"""Profile CDC test data produced to the real broker, and a one-call dumper + processor round."""

from __future__ import annotations

import json
import uuid

from engagement_platform.profiles.processor.apply import process_tenant
from engagement_platform.profiles.staging.apply import STREAM, stage_cdc_batch
from engagement_platform.streams.planning import plan_next_batch

T0 = "2026-01-05T10:00:00Z"


def record(
    tenant: str,
    pid: str,
    seq: int,
    fields: dict | None = None,
    *,
    op: str = "upsert",
    related=None,
    ts: str = T0,
    record_type: str = "person",
) -> dict:
    r = {"tenant": tenant, "primary_id": pid, "record_type": record_type, "op": op, "cdc_seq": seq, "cdc_ts": ts}
    if fields is not None:
        r["fields"] = fields
    if related is not None:
        r["related_ids"] = related
    return r


def encode(records: list[dict | bytes]) -> list[tuple[bytes, bytes]]:
    out = []
    for r in records:
        if isinstance(r, bytes):
            out.append((b"bad", r))
        else:
            out.append((f"{r.get('tenant')}/{r.get('primary_id')}".encode(), json.dumps(r).encode()))
    return out


def new_topic(kafka, partitions: int = 2) -> str:
    name = f"test.profile.cdc.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({name: partitions})
    return name


def plan_all(kafka, checkpoints, topic, stream: str = STREAM, max_per_partition: int = 100_000):
    plan = plan_next_batch(stream, topic, checkpoints.latest_plan(stream), kafka.watermarks(topic), max_per_partition)
    assert plan is not None and checkpoints.record_plan(plan)
    return plan


def stage(spark, kafka, lake, checkpoints, topic, records, **kwargs):
    kafka.produce(topic, encode(records))
    return stage_cdc_batch(
        spark, lake, checkpoints, kafka.bootstrap_servers, plan_all(kafka, checkpoints, topic), **kwargs
    )


def stage_and_process(spark, kafka, lake, checkpoints, topic, records, tenant):
    staged = stage(spark, kafka, lake, checkpoints, topic, records)
    return staged, process_tenant(spark, lake, checkpoints, tenant)
