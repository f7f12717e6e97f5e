"""The retention stream in Dagster: topic engagement.gdpr -> engagement_retention (one partition per
planned slice of TTL / GDPR requests) -> the engagement tables, planned once per retention interval."""

from dagster import AssetKey

from engagement_platform.engagement.assets import GROUP, RETENTION_ASSET, REWRITE_POOL
from engagement_platform.engagement.retention.apply import SPEC, seconds_until_due
from engagement_platform.engagement.retention.checks import RETENTION_CHECKS
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.orchestration.kafka_stream import KafkaStreamDefinition, build_kafka_stream
from engagement_platform.settings import load_settings

TOPIC_ASSET = AssetKey(["kafka", "engagement_gdpr"])


def not_due_yet(store: CheckpointStore) -> str | None:
    """The cadence gate: a reason to skip until EP_RETENTION_INTERVAL_SECONDS (read at run time) have
    passed since the previous batch was planned."""
    interval = load_settings().retention.interval_seconds
    wait = seconds_until_due(store, interval)
    return (
        f"next retention batch due in {wait:.0f}s (cadence {interval}s, EP_RETENTION_INTERVAL_SECONDS)"
        if wait > 0
        else None
    )


RETENTION = build_kafka_stream(
    KafkaStreamDefinition(
        spec=SPEC,
        asset_key=RETENTION_ASSET,
        topic_asset_key=TOPIC_ASSET,
        topic=lambda: load_settings().retention.topic,
        description="Retention stream: each partition is one planned slice of TTL / GDPR requests, applied exactly once (old rows "
        "of an org, or every row of an erased subject, deleted) with one gdpr_audit row per request.",
        topic_description="Kafka topic of TTL / GDPR requests: org retention and subject erasure (EP_GDPR_TOPIC).",
        group=GROUP,
        pool=REWRITE_POOL,  # its deletes rewrite engagement_activity files, like the mutation stream's tasks
        checks=RETENTION_CHECKS,
        job_description="Apply one planned slice of TTL / GDPR requests: org retention and subject erasure, with an audit row each.",
        sensor_description="Plans the next slice of engagement.gdpr (retention and erasure requests) once per "
        "EP_RETENTION_INTERVAL_SECONDS (default daily, read at run time) after the previous batch was planned.",
        # The cadence gate, not the sensor's interval, paces planning. A tick that finds the activity lock held (an
        # ingestion or mutation batch) skips, and a failed batch is retried only by a later tick: at 60 s, each cost up
        # to a minute (a batch due at 1,132 s was planned at 1,257 s when two ticks found the lock held).
        minimum_interval_seconds=10,
        tick_gate=not_due_yet,
    )
)
engagement_gdpr_topic = RETENTION.topic_asset
engagement_retention = RETENTION.asset
retention_batches = RETENTION.partitions
retention_job = RETENTION.job
engagement_retention_sensor = RETENTION.sensor
