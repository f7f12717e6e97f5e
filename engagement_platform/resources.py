"""Dagster resources shared by every domain.

`platform_resources()` is what definitions.py binds: deployment-specific fields come from the
environment through `EnvVar` (resolved when a run launches, shown by name in the launchpad, where
any field can be overridden for one run). A resource built in code (tests, scripts) may leave a
field empty, and then it takes the value settings.py reads at run time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

from dagster import Config, ConfigurableResource, EnvVar, InitResourceContext
from dagster_pyspark import LazyPySparkResource
from kazoo.exceptions import KazooException
from pydantic import PrivateAttr

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.settings import load_settings
from engagement_platform.spark.session import build_session, session_config
from engagement_platform.streams.coordinator import CoordinationGaveUp, Coordinator, JobSpec, Lease, allowed
from engagement_platform.streams.kafka import KafkaClient


class SparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session (created only when an asset asks for it).

    Empty `spark_config` -> SPARK_REMOTE (a Spark Connect server: no JVM start per run) or, when that
    is empty, a classic session on SPARK_MASTER. The `kafka_offsets` data source is registered on it.
    """

    spark_config: dict[str, Any] = {}
    remote: str = ""  # a Spark Connect endpoint (sc://host:port); empty: SPARK_REMOTE, then a classic session

    def _init_session(self) -> None:
        if self._spark_session is None:
            settings = load_settings()
            remote = self.remote or settings.spark_remote
            self._spark_session = build_session(self.spark_config or session_config(remote, settings.spark_master))


class LakeResource(ConfigurableResource):
    """The Delta lake root (local folder or object-store URI) and the checkpoint store in it."""

    root: str = ""  # a folder or object-store URI; empty: EP_LAKE_ROOT

    @property
    def lake(self) -> DeltaLake:
        return DeltaLake(self.root or load_settings().lake_root)

    @property
    def checkpoints(self) -> CheckpointStore:
        return CheckpointStore(self.lake)


class KafkaResource(ConfigurableResource):
    """The Kafka cluster every stream reads (watermarks in sensors, exact offset ranges in Spark tasks)."""

    bootstrap_servers: str = ""  # empty: KAFKA_BOOTSTRAP_SERVERS

    @property
    def servers(self) -> str:
        return self.bootstrap_servers or load_settings().kafka_bootstrap_servers

    @property
    def client(self) -> KafkaClient:
        return KafkaClient(self.servers)


ACTIVITY_LOCK = "engagement_activity"


class JobConfig(Config):
    """One stream's coordination: the lock it takes, its name on the predecessor znode, and the jobs
    allowed to have registered last before it may run (empty: any)."""

    lock_name: str = ACTIVITY_LOCK
    job_name: str
    predecessors: list[str] = []

    def spec(self) -> JobSpec:
        return JobSpec(self.lock_name, self.job_name, frozenset(self.predecessors))


class CoordinatorResource(ConfigurableResource):
    """The ZooKeeper job coordinator and the checkpoint store: the one resource every stream run uses
    for its batch lifecycle (plan lookup, acquire, fenced commits, checkpoint states, release).

    The kazoo session is opened in setup_for_execution (one per run; a ZooKeeper that is down then
    is not an error: the run gives up at acquire) and closed in teardown, which deletes any lock
    znode left behind. `enabled` None means EP_COORDINATOR (default on); off = unfenced commits, as
    without a coordinator. Default predecessor sets (the lifecycle order ingestion -> mutation ->
    retention, each stream allowed to follow itself so a backlog drains at its own cadence):

        ingestion  any of ingestion, mutation, retention   appends need no order
        mutation   ingestion or mutation                   an ID rewrite runs after fresh activities
        retention  any of ingestion, mutation, retention   a daily stream must not wait on the others' timing
    """

    lake: LakeResource
    hosts: str = ""  # "" = ZOOKEEPER_HOSTS
    root: str = ""  # "" = EP_ZK_ROOT
    enabled: Optional[bool] = None  # None = EP_COORDINATOR
    session_timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    lock_timeout_s: float = 30.0
    ingestion: JobConfig = JobConfig(job_name="ingestion", predecessors=["ingestion", "mutation", "retention"])
    mutation: JobConfig = JobConfig(job_name="mutation", predecessors=["ingestion", "mutation"])
    retention: JobConfig = JobConfig(job_name="retention", predecessors=["ingestion", "mutation", "retention"])

    _coordinator: Coordinator | None = PrivateAttr(default=None)

    @property
    def checkpoints(self) -> CheckpointStore:
        return self.lake.checkpoints

    @property
    def is_enabled(self) -> bool:
        return load_settings().coordinator_enabled if self.enabled is None else self.enabled

    def job_spec(self, stream: str, lock_name: str | None = None) -> JobSpec:
        """The configured spec of ingestion / mutation / retention; any other stream (an ingest
        pipeline) locks `lock_name` (default: its own name) and accepts any predecessor."""
        if stream in ("ingestion", "mutation", "retention"):
            return getattr(self, stream).spec()
        return JobSpec(lock_name or stream, stream)

    def coordinator(self) -> Coordinator:
        if self._coordinator is None:
            settings = load_settings()
            self._coordinator = Coordinator(self.hosts or settings.zookeeper_hosts, self.root or settings.zookeeper_root,
                                            self.session_timeout_s)
        return self._coordinator

    def setup_for_execution(self, context: InitResourceContext) -> None:
        if not self.is_enabled:
            return
        try:
            self.coordinator().start(self.connect_timeout_s)
        except CoordinationGaveUp as e:
            if context.log:
                context.log.warning(f"{e}; the batch will give up at acquire")

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._coordinator is not None:
            self._coordinator.close()
            self._coordinator = None

    def predecessor_wait(self, stream: str, batch_id: int, lock_name: str | None = None) -> str | None:
        """Why a run of this batch would give up at register right now (the last registered job is
        not an allowed predecessor, or ZooKeeper is unreachable); None if it may go. A sensor asks
        this before re-requesting a batch whose run gave up, so a stream waiting for its turn skips
        ticks instead of launching a run per tick that waits and fails."""
        if not self.is_enabled:
            return None
        settings = load_settings()
        job = self.job_spec(stream, lock_name)
        probe = Coordinator(self.hosts or settings.zookeeper_hosts, self.root or settings.zookeeper_root, self.session_timeout_s)
        try:
            probe.start(self.connect_timeout_s)
            current = probe.last_registered(job.lock_name)
        except (CoordinationGaveUp, KazooException) as e:
            return f"ZooKeeper unreachable: {e}"
        finally:
            probe.close()
        if allowed(current, job.job_name, f"{stream}/{batch_id}", job.predecessors):
            return None
        return f"last job registered on {job.lock_name} is {current.get('job')!r}, {job.job_name} may follow only {sorted(job.predecessors)}"

    @contextmanager
    def batch(self, stream: str, batch_id: int, lock_name: str | None = None) -> Iterator[Lease | None]:
        """Acquire (lock + register) for one batch, yield the lease, release; None when disabled.
        The owner is the batch ("<stream>/<batch id>"), so a retry of it is its own predecessor."""
        if not self.is_enabled:
            yield None
            return
        with self.coordinator().batch(self.job_spec(stream, lock_name), f"{stream}/{batch_id}", self.lock_timeout_s) as lease:
            yield lease


def platform_resources() -> dict[str, ConfigurableResource]:
    """The resources of the Definitions: one lake (its tables, and the checkpoint store behind the
    coordinator), Kafka, ZooKeeper and Spark, each pointed at the deployment by environment variables
    (`scripts/run_platform.sh` exports the local defaults)."""
    lake = LakeResource(root=EnvVar("EP_LAKE_ROOT"))
    return {
        "spark": SparkResource(remote=EnvVar("SPARK_REMOTE")),
        "lake": lake,
        "kafka": KafkaResource(bootstrap_servers=EnvVar("KAFKA_BOOTSTRAP_SERVERS")),
        "coordinator": CoordinatorResource(lake=lake, hosts=EnvVar("ZOOKEEPER_HOSTS"), root=EnvVar("EP_ZK_ROOT")),
    }
