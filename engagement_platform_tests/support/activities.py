"""Test data: engagement activities produced to the real broker, what the lake must then hold, and one
call that ingests everything produced so far."""

from __future__ import annotations

import json

from engagement_platform.engagement.demo import ActivityGenerator
from engagement_platform.engagement.ingestion import apply as ingestion
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.streams.planning import plan_next_batch

BAD_RECORDS = {
    "not_json": b'{"engagement_id": "bad1", "org_id": ',
    "not_json_array": b"[1, 2, 3]",
    "missing_field": json.dumps(
        {"engagement_id": "bad3", "org_id": "00D000001", "event_time": "2026-01-05T10:00:00Z"}
    ).encode(),
    "wrong_type": json.dumps(
        {"engagement_id": "bad4", "org_id": "00D000001", "activity_type": "call", "event_time": "last tuesday"}
    ).encode(),
    "unknown_activity_type": json.dumps(
        {
            "engagement_id": "bad5",
            "org_id": "00D000001",
            "activity_type": "fax_sent",
            "event_time": "2026-01-05T10:00:00Z",
        }
    ).encode(),
    "oversized": json.dumps(
        {
            "engagement_id": "bad6",
            "org_id": "00D000001",
            "activity_type": "call",
            "event_time": "2026-01-05T10:00:00Z",
            "payload": {"x": "y" * 70_000},
        }
    ).encode(),
}
EXPECTED_CODES = {  # the ingest framework's error codes (engagement_platform/ingest)
    "not_json": {"malformed_record"},
    "not_json_array": {"malformed_record"},
    "missing_field": {"missing_required"},
    "wrong_type": {"wrong_type"},
    "unknown_activity_type": {"not_in_enum"},
    "oversized": {"oversized"},
}


def produce_activities(
    kafka, topic: str, count: int, seed: int = 1, bad: dict[str, bytes] | None = None, id_prefix: str = "e"
) -> dict:
    """Produce `count` good activities (+ the bad records) and return {engagement_id: record} of the good ones."""
    gen = ActivityGenerator(seed=seed, orgs=5, bad_ratio=0.0, id_prefix=id_prefix)
    good = [gen.activity() for _ in range(count)]
    messages = [(r["org_id"].encode(), json.dumps(r).encode()) for r in good]
    messages += [(b"bad", raw) for raw in (bad or {}).values()]
    kafka.produce(topic, messages)
    return {r["engagement_id"]: r for r in good}


def ingest(spark, kafka, lake, checkpoints, topic):
    """Plan and run one ingestion batch of everything on `topic` since the last one."""
    p = plan_next_batch(
        ingestion.STREAM, topic, checkpoints.latest_plan(ingestion.STREAM), kafka.watermarks(topic), 10_000
    )
    assert checkpoints.record_plan(p)
    return ingestion.ingest_batch(spark, lake, checkpoints, kafka.bootstrap_servers, p)


def rows_of(lake, org=None) -> list[dict]:
    filters = [("org_id", "=", org)] if org else None
    return lake.read(ENGAGEMENT_ACTIVITY.name, filters=filters).to_pylist()
