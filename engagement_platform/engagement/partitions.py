"""Dynamic partitions: one per planned batch of a stream (key = zero-padded batch id)."""

from dagster import DynamicPartitionsDefinition

ingestion_batches = DynamicPartitionsDefinition(name="engagement_ingestion_batches")
mutation_batches = DynamicPartitionsDefinition(name="engagement_mutation_batches")
retention_batches = DynamicPartitionsDefinition(name="engagement_retention_batches")
