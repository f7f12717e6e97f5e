"""The only place Definitions are assembled (named by pyproject's [tool.dagster] and workspace.yaml)."""

from dagster import Definitions

from engagement_platform.engagement.assets import engagement_activities_topic, engagement_ingestion, engagement_tables
from engagement_platform.engagement.jobs import ingestion_job
from engagement_platform.engagement.sensors import engagement_ingestion_sensor
from engagement_platform.resources import KafkaResource, LakeResource, SparkResource

defs = Definitions(
    assets=[engagement_activities_topic, engagement_ingestion, *engagement_tables],
    jobs=[ingestion_job],
    sensors=[engagement_ingestion_sensor],
    resources={"spark": SparkResource(), "lake": LakeResource(), "kafka": KafkaResource()},
)
