"""Producing and applying TTL / GDPR requests in tests (real broker, Spark and Delta tables)."""

from __future__ import annotations

import json

from engagement_platform.engagement.retention.apply import STREAM, apply_retention_batch
from engagement_platform.streams.planning import plan_next_batch

ASKED = "2026-02-01T10:00:00Z"


def activity(eid, org, day, lead=None, contact=None) -> dict:
    return {
        "engagement_id": eid,
        "org_id": org,
        "activity_type": "call",
        "event_time": f"{day}T09:00:00Z",
        "engagement_date": str(day),
        "lead_id": lead,
        "contact_id": contact,
        "user_id": "005000001",
    }


def produce(kafka, topic, messages: list) -> None:
    kafka.produce(topic, [(b"k", m if isinstance(m, bytes) else json.dumps(m).encode()) for m in messages])


def gdpr(rid, org, kind, at=ASKED, **fields) -> dict:
    return {"request_id": rid, "org_id": org, "request_time": at, "kind": kind, **fields}


def plan_retention(kafka, checkpoints, topic):
    p = plan_next_batch(STREAM, topic, checkpoints.latest_plan(STREAM), kafka.watermarks(topic), 10_000)
    assert checkpoints.record_plan(p)
    return p


def retain(spark, kafka, lake, checkpoints, topic, requests):
    produce(kafka, topic, requests)
    return apply_retention_batch(
        spark, lake, checkpoints, kafka.bootstrap_servers, plan_retention(kafka, checkpoints, topic)
    )
