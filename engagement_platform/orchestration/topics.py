"""Kafka topics as observable source assets: what a topic's observation and a stream sensor's tick report
(per partition low and high watermarks, their total), plus whatever a stream adds (the profile CDC lag)."""

from collections.abc import Callable

from dagster import AssetKey, AssetObservation, DataVersion, ObserveResult, SourceAsset, observable_source_asset

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.resources import KafkaResource, LakeResource

Watermarks = dict[int, tuple[int, int]]  # partition -> (low, high)
# Extra figures of a topic's observation, from the stream's checkpoints and the watermarks just read.
ObservationMetadata = Callable[[CheckpointStore, Watermarks], dict]


def watermark_metadata(watermarks: Watermarks) -> dict:
    return {
        "messages_total": sum(h for _, h in watermarks.values()),
        **{f"partition_{p}_high": h for p, (_, h) in sorted(watermarks.items())},
        **{f"partition_{p}_low": lo for p, (lo, _) in sorted(watermarks.items())},
    }


def topic_observation(watermarks: Watermarks, key: AssetKey, extra: dict | None = None) -> AssetObservation:
    """What a stream's sensor reports after it read the watermarks (when a figure changed: orchestration/reported.py)."""
    return AssetObservation(asset_key=key, metadata={**watermark_metadata(watermarks), **(extra or {})})


def topic_asset(
    key: AssetKey,
    topic: Callable[[], str],
    description: str,
    group: str,
    observation_metadata: ObservationMetadata | None = None,
) -> SourceAsset:
    """The topic as an observable source asset; its data version is the sum of the high watermarks, so it
    changes exactly when messages arrive. `topic` is read at observation time (settings, not import time)."""

    def observe(kafka: KafkaResource, checkpoints: CheckpointStore | None) -> ObserveResult:
        marks = kafka.client.watermarks(topic())
        extra = (
            observation_metadata(checkpoints, marks)
            if observation_metadata is not None and checkpoints is not None
            else {}
        )
        return ObserveResult(
            data_version=DataVersion(str(sum(h for _, h in marks.values()))),
            metadata={**watermark_metadata(marks), **extra},
        )

    decorate = observable_source_asset(key=key, group_name=group, description=description)
    if observation_metadata is None:  # only a topic with figures of its own needs the lake

        def observe_topic(kafka: KafkaResource) -> ObserveResult:
            return observe(kafka, None)

        return decorate(observe_topic)

    def observe_with_lake(kafka: KafkaResource, lake: LakeResource) -> ObserveResult:
        return observe(kafka, lake.checkpoints)

    return decorate(observe_with_lake)
