"""The only place Definitions are assembled (named by pyproject's [tool.dagster] and workspace.yaml).

Ingest pipelines come from the YAML files in EP_PIPELINES_DIR (default: the repo's pipelines/):
each file adds its landing folder, pipeline asset (with checks), tables, job and landing sensor.
"""

from dagster import Definitions

from engagement_platform.engagement.assets import (
    engagement_activities_topic,
    engagement_gdpr_topic,
    engagement_ingestion,
    engagement_mutation,
    engagement_mutations_topic,
    engagement_retention,
    engagement_tables,
)
from engagement_platform.engagement.jobs import ingestion_job, mutation_job, retention_job
from engagement_platform.engagement.sensors import engagement_ingestion_sensor, engagement_mutation_sensor, engagement_retention_sensor
from engagement_platform.engagement.upkeep.assets import UPKEEP_ASSETS, UPKEEP_CHECKS, UPKEEP_JOBS, UPKEEP_SCHEDULES, UPKEEP_SENSORS
from engagement_platform.landing.assets import pipeline_assets
from engagement_platform.ingest.config import load_pipelines
from engagement_platform.landing.jobs import pipeline_job
from engagement_platform.landing.sensors import landing_sensor
from engagement_platform.profiles.assets import profile_backfill, profile_cdc_staging, profile_cdc_topic_asset, profile_raw, profile_tables
from engagement_platform.profiles.jobs import profile_backfill_job, profile_cdc_staging_job, profile_processor_job
from engagement_platform.profiles.sensors import profile_cdc_dumper_sensor, profile_lag_sensor, profile_processor_sensor
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource
from engagement_platform.settings import load_settings

pipelines = load_pipelines(load_settings().pipelines_dir)
pipeline_jobs = {p.name: pipeline_job(p) for p in pipelines}
lake = LakeResource()  # one lake: the tables, and the checkpoint store behind the coordinator

defs = Definitions(
    assets=[
        engagement_activities_topic, engagement_mutations_topic, engagement_ingestion, engagement_mutation, *engagement_tables,
        engagement_gdpr_topic, engagement_retention,
        *UPKEEP_ASSETS, *[a for p in pipelines for a in pipeline_assets(p)],
        profile_cdc_topic_asset, profile_cdc_staging, profile_raw, profile_backfill, *profile_tables,
    ],
    asset_checks=UPKEEP_CHECKS,
    jobs=[ingestion_job, mutation_job, retention_job, *UPKEEP_JOBS, *pipeline_jobs.values(),
          profile_cdc_staging_job, profile_processor_job, profile_backfill_job],
    schedules=UPKEEP_SCHEDULES,
    sensors=[engagement_ingestion_sensor, engagement_mutation_sensor, engagement_retention_sensor, *UPKEEP_SENSORS, *[landing_sensor(p, pipeline_jobs[p.name]) for p in pipelines],
             profile_cdc_dumper_sensor, profile_processor_sensor, profile_lag_sensor],
    resources={"spark": SparkResource(), "lake": lake, "kafka": KafkaResource(), "coordinator": CoordinatorResource(lake=lake)},
)
