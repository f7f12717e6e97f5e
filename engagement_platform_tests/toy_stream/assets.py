"""The toy stream in Dagster, from the Kafka stream factory: the topic asset, the stream asset (its key is the
table's name, so each batch reports the table as the stream's own materialization), its job and sensor."""

from dagster import AssetKey

from engagement_platform.orchestration.kafka_stream import KafkaStream, KafkaStreamDefinition, build_kafka_stream
from engagement_platform_tests.toy_stream.apply import SPEC, TOY_EVENTS


def toy_kafka_stream(topic: str) -> KafkaStream:
    return build_kafka_stream(
        KafkaStreamDefinition(
            spec=SPEC,
            asset_key=AssetKey(TOY_EVENTS.name),
            topic_asset_key=AssetKey(["kafka", "toy_events"]),
            topic=lambda: topic,
            description="Toy stream: each partition is one planned offset slice, appended to toy_events exactly once.",
            topic_description="Kafka topic of toy events.",
            group="toy",
        )
    )
