"""Profile erasure requests in: a planned slice validated by the ingest framework (pipeline.yaml) plus
repeated request ids (earlier in the batch, or already applied: in profile_erasure_audit from an earlier
batch), flagged on the driver in the one error schema. The request format is in apply.py's docstring."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
from pyspark.sql import SparkSession

from engagement_platform.ingest.config import load_kafka_pipeline
from engagement_platform.ingest.errors import ERRORS, SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.pipeline import reject_on_driver
from engagement_platform.ingest.record_tasks import validate_kafka_slice
from engagement_platform.lake.delta import DeltaLake, text_column
from engagement_platform.profiles.tables import PROFILE_ERASURE_AUDIT
from engagement_platform.streams.planning import BatchPlan

PIPELINE_FILE = Path(__file__).with_name("pipeline.yaml")


@dataclass(frozen=True)
class ErasureRequest:
    request_id: str
    tenant: str
    subject_id: str
    request_time: datetime
    source_partition: int
    source_offset: int


def _audited(lake: DeltaLake, requests: list[ErasureRequest], batch_id: int) -> set[tuple[str, str]]:
    """(tenant, request_id) of these requests an earlier batch already applied (a producer retry)."""
    if not requests or not lake.exists(PROFILE_ERASURE_AUDIT.name):
        return set()
    expr = (
        text_column("tenant").isin(sorted({r.tenant for r in requests}))
        & (ds.field("batch_id") < batch_id)
        & text_column("request_id").isin(sorted({r.request_id for r in requests}))
    )
    rows = (
        lake.table(PROFILE_ERASURE_AUDIT.name)
        .to_pyarrow_dataset()
        .to_table(columns=["tenant", "request_id"], filter=expr)
    )
    return {(r["tenant"], r["request_id"]) for r in rows.to_pylist()}


def validate_requests(
    spark: SparkSession, lake: DeltaLake, bootstrap_servers: str, plan: BatchPlan, kafka_config: dict | None = None
) -> tuple[pa.Table, list[ErasureRequest]]:
    """(validated slice with every error in `_errors`, the requests to apply, in source order)."""
    validated = validate_kafka_slice(
        spark, load_kafka_pipeline(PIPELINE_FILE, plan.topic), bootstrap_servers, plan, kafka_config
    )
    validated = validated.sort_by([(SOURCE_PARTITION, "ascending"), (SOURCE_OFFSET, "ascending")])
    errors = validated[ERRORS].to_pylist()
    candidates = [
        (
            i,
            ErasureRequest(
                r["request_id"], r["tenant"], r["subject_id"], r["request_time"], r[SOURCE_PARTITION], r[SOURCE_OFFSET]
            ),
        )
        for i, r in enumerate(
            validated.select(
                ["request_id", "tenant", "subject_id", "request_time", SOURCE_PARTITION, SOURCE_OFFSET]
            ).to_pylist()
        )
        if not errors[i]
    ]
    earlier = _audited(lake, [r for _, r in candidates], plan.batch_id)
    seen, applied, flagged = set(), [], []
    for i, r in candidates:
        key = (r.tenant, r.request_id)
        if key in seen or key in earlier:
            errors[i] = [
                {
                    "stage": "validate",
                    "plugin": "profile_erasure",
                    "column_name": "request_id",
                    "error_code": "duplicate_request",
                    "message": f"request_id '{r.request_id}' was already received",
                    "value": r.request_id,
                }
            ]
            flagged.append(i)
        else:
            seen.add(key)
            applied.append(r)
    return reject_on_driver(validated, errors, flagged, bootstrap_servers, plan.topic, kafka_config), applied
