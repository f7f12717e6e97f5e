"""The landing pipelines as the platform knows them (registry.py): a family with a stream per YAML file
in EP_PIPELINES_DIR, `ingest/<pipeline>` (run-batch also takes its checkpoint stream, `ingest.<pipeline>`),
each with Dagster parts of its own. run-batch runs the stored plan (its files) `--batch-id` names."""

from engagement_platform.ingest.config import PipelineConfig, load_pipelines
from engagement_platform.ingest.tables import quarantine_spec, target_spec
from engagement_platform.landing.apply import asset_name, landing_spec, stream_name
from engagement_platform.settings import load_settings
from engagement_platform.streams.by_hand import stored_batch
from engagement_platform.streams.definition import StreamDefinition, StreamFamily


def pipeline_definition(config: PipelineConfig) -> StreamDefinition:
    def dagster_parts():
        from engagement_platform.landing.jobs import pipeline_parts  # Dagster: loaded with the Definitions

        return pipeline_parts(config)

    spec = landing_spec(config)
    return StreamDefinition(
        name=f"ingest/{config.name}",
        parts=dagster_parts,
        spec=spec,
        run_batch=stored_batch(spec),
        tables=(target_spec(config), quarantine_spec(config)),
        asset=asset_name(config),
        aliases=(stream_name(config),),
    )


DEFINITION = StreamFamily(
    name="ingest/<pipeline>",
    members=lambda: [pipeline_definition(c) for c in load_pipelines(load_settings().pipelines_dir)],
)
