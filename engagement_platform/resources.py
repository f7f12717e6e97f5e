"""Dagster resources shared by every domain.

Every field defaults to "" meaning "from settings.py at run time", so the same Definitions run
locally and in production; the launchpad can still override any field for one run.
"""

from __future__ import annotations

from typing import Any

from dagster import ConfigurableResource
from dagster_pyspark import LazyPySparkResource

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.settings import load_settings
from engagement_platform.spark.session import build_session, session_config
from engagement_platform.streams.kafka import KafkaClient


class SparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session (created only when an asset asks for it).

    Empty `spark_config` -> SPARK_REMOTE (a Spark Connect server: no JVM start per run) or, when that
    is empty, a classic session on SPARK_MASTER. The `kafka_offsets` data source is registered on it.
    """

    spark_config: dict[str, Any] = {}

    def _init_session(self) -> None:
        if self._spark_session is None:
            settings = load_settings()
            self._spark_session = build_session(self.spark_config or session_config(settings.spark_remote, settings.spark_master))


class LakeResource(ConfigurableResource):
    """The Delta lake root (local folder or object-store URI) and the checkpoint store in it."""

    root: str = ""

    @property
    def lake(self) -> DeltaLake:
        return DeltaLake(self.root or load_settings().lake_root)

    @property
    def checkpoints(self) -> CheckpointStore:
        return CheckpointStore(self.lake)


class KafkaResource(ConfigurableResource):
    bootstrap_servers: str = ""

    @property
    def servers(self) -> str:
        return self.bootstrap_servers or load_settings().kafka_bootstrap_servers

    @property
    def client(self) -> KafkaClient:
        return KafkaClient(self.servers)
