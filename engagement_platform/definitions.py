"""The only place Definitions are assembled (named by pyproject's [tool.dagster] and workspace.yaml):
one line per stream or package, each contributing its assets, checks, jobs, sensors and schedules.

Ingest pipelines come from the YAML files in EP_PIPELINES_DIR (default: the repo's pipelines/):
each file adds its landing folder, pipeline asset (with checks), tables, job and landing sensor.
"""

from dagster import Definitions

from engagement_platform.engagement.assets import ENGAGEMENT_TABLES
from engagement_platform.engagement.ingestion.assets import INGESTION
from engagement_platform.engagement.metrics.assets import METRICS
from engagement_platform.engagement.mutation.assets import MUTATION
from engagement_platform.engagement.retention.assets import RETENTION
from engagement_platform.engagement.upkeep.assets import UPKEEP
from engagement_platform.ingest.config import load_pipelines
from engagement_platform.landing.jobs import LANDING_UPKEEP, pipeline_parts
from engagement_platform.orchestration.parts import combine
from engagement_platform.profiles.assets import PROFILE_TABLES
from engagement_platform.profiles.backfill.assets import BACKFILL
from engagement_platform.profiles.erasure.assets import ERASURE
from engagement_platform.profiles.processor.sensors import PROCESSOR
from engagement_platform.profiles.segments.assets import SEGMENTS
from engagement_platform.profiles.staging.assets import PROFILE_CDC
from engagement_platform.resources import platform_resources
from engagement_platform.settings import load_settings

defs = Definitions(
    **combine(
        INGESTION,
        MUTATION,
        RETENTION,
        ENGAGEMENT_TABLES,
        UPKEEP,
        METRICS,  # the engagement activity lake and a consumer
        *(pipeline_parts(p) for p in load_pipelines(load_settings().pipelines_dir)),
        LANDING_UPKEEP,  # landing-file pipelines
        PROFILE_CDC,
        PROCESSOR,
        BACKFILL,
        PROFILE_TABLES,
        ERASURE,
        SEGMENTS,  # the unified-profile CDC lake
    ),
    resources=platform_resources(),
)
