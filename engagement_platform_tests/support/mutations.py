"""ID mutation requests produced to the real broker, and one call that plans and applies a batch of them."""

from __future__ import annotations

import json

from engagement_platform.engagement.mutation.apply import STREAM, apply_mutation_batch
from engagement_platform.streams.planning import plan_next_batch


def req(rid, org, minute, op, **fields) -> dict:
    return {"request_id": rid, "org_id": org, "request_time": f"2026-02-01T10:{minute:02d}:00Z", "op": op, **fields}


def produce_requests(kafka, topic, requests: list) -> None:
    kafka.produce(topic, [(b"m", r if isinstance(r, bytes) else json.dumps(r).encode()) for r in requests])


def plan_mutations(kafka, checkpoints, topic):
    p = plan_next_batch(STREAM, topic, checkpoints.latest_plan(STREAM), kafka.watermarks(topic), 10_000)
    assert checkpoints.record_plan(p)
    return p


def mutate(spark, kafka, lake, checkpoints, topic, requests: list, **kwargs):
    produce_requests(kafka, topic, requests)
    return apply_mutation_batch(
        spark, lake, checkpoints, kafka.bootstrap_servers, plan_mutations(kafka, checkpoints, topic), **kwargs
    )
