"""One job per pipeline, in-process (Spark is the long-lived Connect server), one run at a time per
pipeline (the stream tag's concurrency limit in dagster.yaml); and everything one pipeline adds to the
Definitions."""

from dagster import AssetSelection, define_asset_job, in_process_executor

from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.landing.apply import stream_name
from engagement_platform.landing.assets import pipeline_assets, pipeline_key
from engagement_platform.landing.partitions import pipeline_batches
from engagement_platform.landing.sensors import landing_sensor
from engagement_platform.orchestration.parts import Parts
from engagement_platform.orchestration.runs import STREAM_TAG


def pipeline_job(config: PipelineConfig):
    return define_asset_job(
        f"ingest_{config.name}_job",
        selection=AssetSelection.assets(pipeline_key(config)),
        partitions_def=pipeline_batches(config),
        executor_def=in_process_executor,
        tags={STREAM_TAG: stream_name(config)},
        description=f"Run pipeline {config.name} on one landing file.",
    )


def pipeline_parts(config: PipelineConfig) -> Parts:
    """The pipeline's assets (landing folder, pipeline, tables), its job and its landing sensor."""
    job = pipeline_job(config)
    return Parts(assets=pipeline_assets(config), jobs=[job], sensors=[landing_sensor(config, job)])
