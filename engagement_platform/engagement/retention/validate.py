"""Retention / erasure requests in: a planned slice validated by the ingest framework (pipeline.yaml) plus
the driver-side checks of requests.py (the kind's fields, request times in the future) and repeated
request ids (earlier in the batch, or already applied: in gdpr_audit at the pinned version), all in the
one error schema. The request format is in requests.py."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
from pyspark.sql import SparkSession

from engagement_platform.engagement.retention.erasure import read_at
from engagement_platform.engagement.retention.requests import RetentionRequest, canonical_request, error
from engagement_platform.engagement.retention.tables import GDPR_AUDIT
from engagement_platform.ingest.config import PipelineConfig, load_kafka_pipeline
from engagement_platform.ingest.errors import ERRORS, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import reject_on_driver
from engagement_platform.ingest.record_tasks import validate_kafka_slice
from engagement_platform.lake.delta import DeltaLake, text_column
from engagement_platform.streams.planning import BatchPlan

PIPELINE_FILE = Path(__file__).with_name("pipeline.yaml")


def retention_pipeline(topic: str) -> PipelineConfig:
    return load_kafka_pipeline(PIPELINE_FILE, topic)


def _audited(lake: DeltaLake, version: int, requests: list[RetentionRequest], batch_id: int) -> set[tuple[str, str]]:
    """(org_id, request_id) of these requests an earlier batch already applied (a producer retry)."""
    if not requests:
        return set()
    expr = (
        ds.field("org_id").isin(sorted({r.org_id for r in requests}))
        & text_column("request_id").isin(sorted({r.request_id for r in requests}))
        & (ds.field("batch_id") < batch_id)
    )
    rows = read_at(lake, GDPR_AUDIT.name, version, expr, ["org_id", "request_id"])
    return {(r["org_id"], r["request_id"]) for r in rows.to_pylist()}


def validate_requests(
    spark: SparkSession,
    lake: DeltaLake,
    bootstrap_servers: str,
    plan: BatchPlan,
    as_of: datetime,
    audit_version: int,
    kafka_config: dict | None = None,
) -> tuple[pa.Table, list[RetentionRequest | None]]:
    """(validated slice with every error in `_errors`, request per row or None if quarantined)."""
    validated = validate_kafka_slice(spark, retention_pipeline(plan.topic), bootstrap_servers, plan, kafka_config)
    validated = validated.sort_by([(SOURCE_PARTITION, "ascending"), (SOURCE_OFFSET, "ascending")])
    rows, errors = validated.to_pylist(), validated[ERRORS].to_pylist()
    requests: list[RetentionRequest | None] = [None] * len(rows)
    flagged, candidates = [], {}
    for i, row in enumerate(rows):
        if errors[i]:
            continue
        request, found = canonical_request(row, as_of)
        if found:
            errors[i] = found
            flagged.append(i)
        else:
            candidates[i] = request
    earlier = _audited(lake, audit_version, list(candidates.values()), plan.batch_id)
    seen: set[tuple[str, str]] = set()
    for i, r in candidates.items():
        key = (r.org_id, r.request_id)
        if key in seen:
            errors[i] = [
                error(
                    "request_id",
                    "duplicate_in_batch",
                    f"request_id '{r.request_id}' already appears earlier in this batch",
                    r.request_id,
                )
            ]
        elif key in earlier:
            errors[i] = [
                error(
                    "request_id",
                    "duplicate_request",
                    f"request_id '{r.request_id}' was already applied by an earlier batch",
                    r.request_id,
                )
            ]
        else:
            seen.add(key)
            requests[i] = r
            continue
        flagged.append(i)
    validated = reject_on_driver(validated, errors, flagged, bootstrap_servers, plan.topic, kafka_config)
    return validated, requests
