"""The ingestion stream in Dagster: topic engagement.activities -> engagement_ingestion (one partition
per planned offset slice, appended exactly once) -> the engagement tables."""

from dagster import AssetKey

from engagement_platform.engagement.assets import GROUP, INGESTION_ASSET
from engagement_platform.engagement.ingestion.apply import SPEC
from engagement_platform.engagement.ingestion.checks import INGESTION_CHECKS
from engagement_platform.orchestration.kafka_stream import KafkaStreamDefinition, build_kafka_stream
from engagement_platform.settings import load_settings

TOPIC_ASSET = AssetKey(["kafka", "engagement_activities"])

INGESTION = build_kafka_stream(
    KafkaStreamDefinition(
        spec=SPEC,
        asset_key=INGESTION_ASSET,
        topic_asset_key=TOPIC_ASSET,
        topic=lambda: load_settings().ingestion.topic,
        description="Ingestion stream: each partition is one planned Kafka offset slice, appended exactly once.",
        topic_description="Kafka topic of engagement activities from the sales apps (EP_ACTIVITIES_TOPIC).",
        group=GROUP,
        kinds=frozenset({"spark", "deltalake", "kafka"}),
        checks=INGESTION_CHECKS,
        job_description="Ingest one planned Kafka slice into the engagement lake (data, quarantine, notifications).",
        sensor_description="Plans the next offset slice of engagement.activities when the previous batch is done.",
    )
)
engagement_activities_topic = INGESTION.topic_asset
engagement_ingestion = INGESTION.asset
ingestion_batches = INGESTION.partitions
ingestion_job = INGESTION.job
engagement_ingestion_sensor = INGESTION.sensor
