"""The toy stream's definition: what registry.py's one line names. Its topic is a parameter here so that
each test reads a fresh one; a stream of the platform reads its topic from its settings section instead."""

from engagement_platform.streams.by_hand import stored_batch
from engagement_platform.streams.definition import StreamDefinition
from engagement_platform_tests.toy_stream.apply import SPEC, TOY_EVENTS


def toy_stream(topic: str) -> StreamDefinition:
    def dagster_parts():
        from engagement_platform_tests.toy_stream.assets import toy_kafka_stream  # Dagster: with the Definitions

        return toy_kafka_stream(topic)

    return StreamDefinition(
        name=SPEC.name, parts=dagster_parts, spec=SPEC, run_batch=stored_batch(SPEC), tables=(TOY_EVENTS,)
    )


DEFINITION = toy_stream("toy.events")
