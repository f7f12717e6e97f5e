"""Dynamic partitions of a pipeline: one per batch of landing files (key = zero-padded batch id)."""

from dagster import DynamicPartitionsDefinition

from engagement_platform.ingest.config import PipelineConfig


def pipeline_batches(config: PipelineConfig) -> DynamicPartitionsDefinition:
    return DynamicPartitionsDefinition(name=f"ingest_{config.name}_batches")
