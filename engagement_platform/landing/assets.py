"""Assets of an ingest pipeline: landing folder -> pipeline batches -> target + quarantine tables.

As for the Kafka-fed streams, the pipeline is a partitioned asset (one partition per batch of landing
files) and the Delta tables are downstream assets whose materializations each batch reports.
"""

from dagster import AssetExecutionContext, AssetKey, AssetSpec, MaterializeResult, asset

from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.landing.apply import asset_name, quarantine_spec, run_file_batch, stream_name, target_spec
from engagement_platform.landing.checks import evaluate_pipeline_checks, pipeline_check_specs
from engagement_platform.landing.partitions import pipeline_batches
from engagement_platform.orchestration.orphans import stranded_metadata
from engagement_platform.orchestration.ride_out import run_riding_out_faults, spark_reconnect
from engagement_platform.orchestration.runs import report_table_commits
from engagement_platform.resources import CoordinatorResource, LakeResource, SparkResource

GROUP = "ingest"


def landing_key(config: PipelineConfig) -> AssetKey:
    return AssetKey(["landing", config.name])


def pipeline_key(config: PipelineConfig) -> AssetKey:
    return AssetKey(asset_name(config))


def pipeline_assets(config: PipelineConfig) -> list:
    """[landing folder spec, the pipeline asset, target table spec, quarantine table spec]."""
    key = pipeline_key(config)
    stream = stream_name(config)
    target, quarantine = target_spec(config), quarantine_spec(config)

    @asset(
        key=key,
        deps=[landing_key(config)],
        partitions_def=pipeline_batches(config),
        check_specs=pipeline_check_specs(config, key),
        group_name=GROUP,
        kinds={"spark", "deltalake"},
        description=f"Pipeline {config.name}: each partition is one batch of landing files, parsed, converted and validated exactly once. {config.description}",
        metadata={
            "converters": ", ".join(c.plugin for c in config.converters) or "-",
            "validators": ", ".join(v.plugin for v in config.validators) or "-",
            "max_error_rate": config.error_rate.max_error_rate,
        },
    )
    def _pipeline(
        context: AssetExecutionContext, spark: SparkResource, lake: LakeResource, coordinator: CoordinatorResource
    ) -> MaterializeResult:
        plan = coordinator.checkpoints.plan(stream, int(context.partition_key))
        result = run_riding_out_faults(
            context,
            stream,
            lambda: run_file_batch(spark.spark_session, lake.lake, coordinator.checkpoints, config, plan),
            coordinator,
            lock_name=target.name,
            on_fault=spark_reconnect(spark),
        )  # the lock is the target table
        report_table_commits(
            context, stream, plan.batch_id, result.versions, files=len(result.files), first_file=result.files[0].path
        )
        return MaterializeResult(
            metadata={**result.metadata(), **stranded_metadata(context)},
            check_results=evaluate_pipeline_checks(lake.lake, config, result),
        )

    landing = AssetSpec(
        key=landing_key(config),
        group_name=GROUP,
        kinds={"file"},
        description=f"Landing folder of pipeline {config.name}: files matching {config.source.path} ({config.source.format}).",
    )
    tables = [
        AssetSpec(
            key=spec.name,
            deps=[key],
            group_name=GROUP,
            kinds={"deltalake"},
            description=description,
            metadata={"partitioned_by": ", ".join(spec.partition_by) or "-"},
        )
        for spec, description in (
            (target, f"Rows of pipeline {config.name} that passed every stage."),
            (quarantine, f"Records pipeline {config.name} rejected, one row per error, in the one error schema."),
        )
    ]
    return [landing, _pipeline, *tables]
