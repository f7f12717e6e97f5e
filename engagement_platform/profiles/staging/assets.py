"""The CDC dumper in Dagster: topic profile.cdc -> profile_cdc_staging (one partition per planned offset
slice, appended exactly once). The stream takes no lock, so its sensor and asset need no coordinator."""

from engagement_platform.orchestration.kafka_stream import KafkaStreamDefinition, build_kafka_stream
from engagement_platform.profiles.assets import GROUP, STAGING_ASSET, TOPIC_ASSET, cdc_observation_metadata
from engagement_platform.profiles.staging.apply import SPEC
from engagement_platform.profiles.staging.checks import STAGING_CHECKS
from engagement_platform.settings import load_settings

PROFILE_CDC = build_kafka_stream(
    KafkaStreamDefinition(
        spec=SPEC,
        asset_key=STAGING_ASSET,
        topic_asset_key=TOPIC_ASSET,
        topic=lambda: load_settings().profiles.cdc_topic,
        description="Every tenant's profile CDC changes as staged from Kafka, append-only, by tenant and 15-minute bucket; "
        "each partition is one planned offset slice, appended exactly once.",
        topic_description="Kafka topic of unified-profile CDC changes from the hot store (EP_PROFILE_CDC_TOPIC).",
        group=GROUP,
        kinds=frozenset({"spark", "deltalake", "kafka"}),
        checks=STAGING_CHECKS,
        job_description="Stage one planned slice of profile.cdc (append to profile_cdc_staging, quarantine the bad records).",
        sensor_description="Plans the next offset slice of profile.cdc when the previous dumper batch is done.",
        observation_metadata=cdc_observation_metadata,
        partitions_name="profile_cdc_batches",
        sensor_name="profile_cdc_dumper_sensor",
    )
)
profile_cdc_topic_asset = PROFILE_CDC.topic_asset
profile_cdc_staging = PROFILE_CDC.asset
profile_cdc_batches = PROFILE_CDC.partitions
profile_cdc_staging_job = PROFILE_CDC.job
profile_cdc_dumper_sensor = PROFILE_CDC.sensor
