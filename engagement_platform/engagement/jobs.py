"""Jobs of the engagement lake: one per stream, run in-process so a run starts no extra processes
(Spark is a long-lived Connect server; a subprocess per step would each pay Python + import time)."""

from dagster import AssetSelection, define_asset_job, in_process_executor

from engagement_platform.orchestration.runs import STREAM_TAG
from engagement_platform.engagement.assets import INGESTION_ASSET, MUTATION_ASSET, RETENTION_ASSET
from engagement_platform.engagement.partitions import ingestion_batches, mutation_batches, retention_batches

ingestion_job = define_asset_job(
    "engagement_ingestion_job",
    selection=AssetSelection.assets(INGESTION_ASSET),
    partitions_def=ingestion_batches,
    executor_def=in_process_executor,
    tags={STREAM_TAG: "ingestion"},
    description="Ingest one planned Kafka slice into the engagement lake (data, quarantine, notifications).",
)

mutation_job = define_asset_job(
    "engagement_mutation_job",
    selection=AssetSelection.assets(MUTATION_ASSET),
    partitions_def=mutation_batches,
    executor_def=in_process_executor,
    tags={STREAM_TAG: "mutation"},
    description="Apply one planned slice of ID mutation requests to the engagement lake (one MERGE).",
)

retention_job = define_asset_job(
    "engagement_retention_job",
    selection=AssetSelection.assets(RETENTION_ASSET),
    partitions_def=retention_batches,
    executor_def=in_process_executor,
    tags={STREAM_TAG: "retention"},
    description="Apply one planned slice of TTL / GDPR requests: org retention and subject erasure, with an audit row each.",
)
