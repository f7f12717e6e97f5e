"""One job per pipeline, in-process (Spark is the long-lived Connect server), one run at a time per
pipeline (the stream tag's concurrency limit in dagster.yaml)."""

from dagster import AssetSelection, define_asset_job, in_process_executor

from engagement_platform.orchestration.runs import STREAM_TAG
from engagement_platform.landing.assets import pipeline_key
from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.landing.apply import stream_name
from engagement_platform.landing.partitions import pipeline_batches


def pipeline_job(config: PipelineConfig):
    return define_asset_job(
        f"ingest_{config.name}_job",
        selection=AssetSelection.assets(pipeline_key(config)),
        partitions_def=pipeline_batches(config),
        executor_def=in_process_executor,
        tags={STREAM_TAG: stream_name(config)},
        description=f"Run pipeline {config.name} on one landing file.",
    )
