"""Mutation requests in: a planned slice validated by the ingest framework (pipeline.yaml) plus the
driver-side checks (request_columns.check_requests), and the canonical request JSON (how the request
log and the pending table store a request) back to a MutationRequest.

Requests (JSON, one per Kafka message; keys map onto requests.MutationRequest):

    common   request_id (str), org_id (str), request_time (ISO timestamp), op: convert|merge|delete|update,
             optional date_from / date_to (ISO dates, inclusive): only rows whose engagement_date is in range
    convert  from_field, from_id, to_field, to_id     -> MutationRequest(field=from_field, owner_id=from_id, to_field, to_id)
    merge    field, from_ids ([str, ...]), to_id       -> MutationRequest(field, from_ids, to_id)
    delete   engagement_id                             -> MutationRequest(engagement_id)          (one row)
             or field + id                             -> MutationRequest(field, owner_id=id)     (every row of an owner)
    update   engagement_id, record {column: value}     -> MutationRequest(engagement_id, record)

    Owner fields: lead_id, contact_id, account_id, user_id. An update's record may name any
    engagement_activity column except org_id, engagement_id and the ingestion columns; it replaces
    the owner ids and engagement_date (a missing one becomes null, as in the cascade reference) and
    sets every other column it names; columns it does not name keep their values.

    {"request_id": "r1", "org_id": "00D000001", "request_time": "2026-01-06T10:00:00Z", "op": "convert",
     "from_field": "lead_id", "from_id": "00Q000001", "to_field": "contact_id", "to_id": "003000009"}
"""

from __future__ import annotations

import time
from datetime import date
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from engagement_platform.engagement.mutation.request_columns import (
    CheckedRequests,
    check_requests,
    parse_timestamp,
    typed_record,
)
from engagement_platform.engagement.mutation.requests import MutationRequest
from engagement_platform.ingest.config import PipelineConfig, load_kafka_pipeline
from engagement_platform.ingest.errors import ERRORS, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import reject_on_driver
from engagement_platform.ingest.record_tasks import validate_kafka_slice
from engagement_platform.streams.planning import BatchPlan

PIPELINE_FILE = Path(__file__).with_name("pipeline.yaml")


def mutation_pipeline(topic: str) -> PipelineConfig:
    return load_kafka_pipeline(PIPELINE_FILE, topic)


def request_from_json(d: dict) -> MutationRequest:
    """The canonical request JSON (request_json column) -> MutationRequest."""
    dates = {k: date.fromisoformat(d[k]) if d.get(k) else None for k in ("date_from", "date_to")}
    rid, org, at, op = d["request_id"], d["org_id"], parse_timestamp(d["request_time"]), d["op"]
    if op == "convert":
        return MutationRequest.convert(rid, org, at, d["from_field"], d["from_id"], d["to_field"], d["to_id"], **dates)
    if op == "merge":
        return MutationRequest.merge(rid, org, at, d["field"], d["from_ids"], d["to_id"], **dates)
    if op == "delete" and d.get("engagement_id"):
        return MutationRequest.delete_engagement(rid, org, at, d["engagement_id"], **dates)
    if op == "delete":
        return MutationRequest.delete_owner(rid, org, at, d["field"], d["id"], **dates)
    if op == "update":
        return MutationRequest.update(rid, org, at, d["engagement_id"], typed_record(d["record"]), **dates)
    raise ValueError(f"unknown op {op!r}")


def validate_requests(
    spark: SparkSession,
    bootstrap_servers: str,
    plan: BatchPlan,
    kafka_config: dict | None = None,
    seconds: dict[str, float] | None = None,
) -> tuple[pa.Table, CheckedRequests]:
    """(validated slice with every error in `_errors`, the requests that passed, canonical).

    The framework validates in Spark; the op-dependent checks and duplicate request ids are added here
    (request_columns.check_requests); rows flagged here get their raw bytes back from Kafka. The two
    parts' seconds go into `seconds` (spark_validate, driver_checks)."""
    t = time.perf_counter()
    validated = validate_kafka_slice(spark, mutation_pipeline(plan.topic), bootstrap_servers, plan, kafka_config)
    validated = validated.sort_by([(SOURCE_PARTITION, "ascending"), (SOURCE_OFFSET, "ascending")])
    spark_s = time.perf_counter() - t
    checked = check_requests(validated)
    if seconds is not None:
        seconds.update(spark_validate=spark_s, driver_checks=time.perf_counter() - t - spark_s)
    if checked.errors:
        errors = validated[ERRORS].to_pylist()
        for i, found in checked.errors.items():
            errors[i] = found
        validated = reject_on_driver(
            validated, errors, sorted(checked.errors), bootstrap_servers, plan.topic, kafka_config
        )
    return validated, checked
