"""A fourth Kafka-fed stream built from the factory with fakes (no broker, no Spark), for tests of the
Dagster side of the stream framework."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from dagster import AssetCheckResult, AssetKey
from kazoo.client import KazooClient

from engagement_platform.orchestration.checks import (
    RECORDS_CONSERVED,
    BatchChecks,
    conservation,
    notifications_match_changes,
)
from engagement_platform.orchestration.kafka_stream import KafkaStreamDefinition, build_kafka_stream
from engagement_platform.resources import KafkaResource, SparkResource
from engagement_platform.streams.coordinator import Coordinator
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.spec import StreamSpec


@dataclass
class ClicksResult:
    plan: BatchPlan
    records_read: int
    rows: int
    versions: dict = field(default_factory=lambda: {"demo_clicks_table": None})  # None: committed by an earlier attempt

    def metadata(self) -> dict:
        return {"batch_id": self.plan.batch_id, "records_read": self.records_read}


def not_run(ctx, plan):
    raise AssertionError("no batch runs in this test")


def count_clicks(ctx, plan) -> ClicksResult:
    return ClicksResult(plan, plan.record_count, plan.record_count)


class NoSpark(SparkResource):
    """The run's Spark session, never started: the test's batch does not use it."""

    def _init_session(self) -> None:
        self._spark_session = "no spark session"


def records(lake, checkpoints, result) -> list[AssetCheckResult]:
    return [conservation(RECORDS_CONSERVED, ("records_read", result.records_read), {"rows_in_table": result.rows})]


def clicks_stream(lock_name=None, run_batch=not_run, **overrides):
    return build_kafka_stream(
        KafkaStreamDefinition(
            spec=StreamSpec(name="clicks", app_id="demo.clicks", run_batch=run_batch, lock_name=lock_name),
            asset_key=AssetKey("demo_clicks"),
            topic_asset_key=AssetKey(["kafka", "demo_clicks"]),
            topic=lambda: "demo.clicks",
            description="Clicks stream: each partition is one planned offset slice.",
            topic_description="Kafka topic of clicks.",
            group="demo",
            checks=[
                BatchChecks({RECORDS_CONSERVED: "Records read = rows appended."}, records),
                notifications_match_changes("demo_notifications", "demo_clicks_table", "demo.clicks"),
            ],
            **overrides,
        )
    )


class FiveMessages(KafkaResource):
    """Kafka answering every watermark question with 5 messages in partition 0 (no broker needed)."""

    @property
    def client(self):
        return SimpleNamespace(watermarks=lambda topic: {0: (0, 5)})


def expire_session(coordinator: Coordinator) -> None:
    """Close the coordinator's session from another connection: the server expires it at once
    (ephemeral znodes deleted) and the coordinator's client finds out on its next reconnect."""
    other = KazooClient(hosts=coordinator.hosts, client_id=coordinator.client.client_id)
    other.start(timeout=5)
    other.stop()
    other.close()
