"""Dagster resources shared by every domain.

`platform_resources()` is what definitions.py binds. Its deployment-specific fields are left empty, and
an empty field takes the value settings.py reads when a run or a sensor tick uses the resource (not when
the code loads): every setting with a documented default (docs/reference/configuration.md) works unset,
under `dagster dev` started by hand as under scripts/run_platform.sh. The launchpad can still set any
field for one run. None is bound with `EnvVar`: Dagster fails the config of a run or tick whose EnvVar
is unset, and every variable behind these fields has a default.

Long by design: CoordinatorResource is one ZooKeeper session shared by a run's lock, its liveness node and
a sensor's questions, and reads best whole.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from dagster import Config, ConfigurableResource, InitResourceContext
from dagster_pyspark import LazyPySparkResource
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from pydantic import PrivateAttr

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.settings import load_settings
from engagement_platform.spark.session import build_session, discard_shared_client, session_config
from engagement_platform.streams.coordinator import (
    CoordinationGaveUp,
    Coordinator,
    JobSpec,
    Lease,
    LockBusy,
    allowed,
    is_bounded,
    run_liveness_info,
    wait_ends,
)
from engagement_platform.streams.kafka import KafkaClient
from engagement_platform.streams.shared_kafka import shared_kafka_client


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

    def reconnect(self) -> None:
        """A new session on the next use when the Spark Connect server restarted under the run: the client of
        the shared session is closed and forgotten. Any other session is kept (a classic in-process one has no
        server to lose; a per-run one is not stopped while its server may be away)."""
        if self._spark_session is not None and discard_shared_client(self._spark_session):
            self._spark_session = None


class LakeResource(ConfigurableResource):
    """The Delta lake root (local folder or object-store URI) and the checkpoint store in it."""

    root: str = ""  # a folder or object-store URI; empty: EP_LAKE_ROOT

    @property
    def lake(self) -> DeltaLake:
        settings = load_settings()
        return DeltaLake(self.root or settings.lake_root, settings.storage_options or None)

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
        """The process's client for these servers: a sensor tick asks its watermarks of one long-lived consumer
        instead of starting two librdkafka instances each time (streams/shared_kafka.py)."""
        return shared_kafka_client(self.servers)


ACTIVITY_LOCK = "engagement_activity"
# After ZooKeeper did not answer, a sensor's questions give up at once for this long: a tick ends well within it,
# and a caller that outlives it (one waiting for ZooKeeper to come back) asks ZooKeeper again.
ASK_AGAIN_AFTER_S = 10.0


class JobConfig(Config):
    """One stream's coordination: the lock it takes, its name on the predecessor znode, and the jobs
    allowed to have registered last before it may run (empty: any)."""

    lock_name: str = ACTIVITY_LOCK
    job_name: str
    predecessors: list[str] = []

    def spec(self, max_predecessor_wait_s: float | None = None) -> JobSpec:
        return JobSpec(self.lock_name, self.job_name, frozenset(self.predecessors), max_predecessor_wait_s)


ENGAGEMENT_STREAMS = ("ingestion", "mutation", "retention")  # the streams with a JobConfig of their own


def holder_owner(identity: str) -> str:
    """The owner ("mutation/7") in a lock contender's identity (JSON {owner, host, pid}), else the identity."""
    try:
        parsed = json.loads(identity)
    except ValueError:
        return identity
    return str(parsed.get("owner") or identity) if isinstance(parsed, dict) else identity


def turn_passed_over(job: str, predecessor_sets: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """The last registered jobs that `job`, finding nothing to do, may replace with its own (idle) registration
    (pure). Replacing X with `job` changes, for every job Z, "may Z follow X" into "may Z follow `job`"; an idle
    job has no work any other job should wait for, so the change may unblock a Z that waits for `job` (job is in
    Z's set, X is not) and must change nothing else: no Z that may follow X but not `job` is blocked, and `job`
    itself neither (an idle mutation must not let the next mutation batch skip ingestion). An empty set admits
    anyone and takes no part."""
    rules = {name: jobs for name, jobs in predecessor_sets.items() if jobs}

    def may_follow(follower: str, last: str) -> bool:
        return follower not in rules or last in rules[follower]

    return frozenset(
        last
        for last in predecessor_sets
        if last != job
        and any(may_follow(z, job) and not may_follow(z, last) for z in rules if z != job)
        and all(may_follow(z, last) <= may_follow(z, job) for z in rules if z != job)
        and may_follow(job, last) == may_follow(job, job)
    )


class CoordinatorResource(ConfigurableResource):
    """The ZooKeeper job coordinator and the checkpoint store: the one resource every stream run uses
    for its batch lifecycle (plan lookup, acquire, fenced commits, checkpoint states, release).

    The kazoo session is opened in setup_for_execution (one per run; a ZooKeeper that is down then
    is not an error: the run gives up at acquire; a sensor's evaluation opens it at its first question
    instead, so a tick that asks nothing costs no session) and closed in teardown, which deletes any lock
    znode left behind. `enabled` None means EP_COORDINATOR (default on); off = unfenced commits, as
    without a coordinator. Default predecessor sets (the lifecycle order ingestion -> mutation ->
    retention, each stream allowed to follow itself so a backlog drains at its own cadence):

        ingestion  any of ingestion, mutation, retention   appends need no order
        mutation   ingestion or mutation                   an ID rewrite runs after fresh activities
        retention  any of ingestion, mutation, retention   a daily stream must not wait on the others' timing

    The predecessor wait is bounded: a last registered job outside the set counts as allowed once it
    registered `max_predecessor_wait_s` ago (ZooKeeper's clock; None = EP_MAX_PREDECESSOR_WAIT_SECONDS,
    default 120 s; infinity = strict order), so a quiet predecessor never holds a stream back for good.

    The lock: a run waits for it in rounds of `lock_timeout_s`, logging the holder after each, up to
    `max_lock_wait_s` in all, and only then gives up (a failure tagged engagement/coordination=gave_up).

    Run liveness: setup also registers the run's ephemeral node `<root>/runs/<run id>` on the session
    (host, pid, process start, stream, partition); teardown, or the death of the process, removes it.
    A sensor that finds a run of its stream STARTED without that node, and without a sign of life for
    `orphan_after_s` (None = EP_ORPHAN_AFTER_SECONDS, default 60 s), marks it failed (orchestration/orphans.py).
    A ZooKeeper that is down at setup does not fail the run: its node appears once the session connects.
    """

    lake: LakeResource
    hosts: str = ""  # "" = ZOOKEEPER_HOSTS
    root: str = ""  # "" = EP_ZK_ROOT
    enabled: bool | None = None  # None = EP_COORDINATOR
    session_timeout_s: float = 10.0
    reconnect_wait_s: float = 60.0  # a lease check's wait for a suspended session to come back (a ZooKeeper restart)
    ride_out_faults_s: float = (
        120.0  # a stream run tries its batch again after passing faults for this long (0: fail at once)
    )
    connect_timeout_s: float = 5.0
    lock_timeout_s: float = 30.0  # one round of waiting for the lock (the tenant locks of profiles: the whole wait)
    max_lock_wait_s: float = 600.0  # a stream run's whole wait for the lock before it gives up
    max_predecessor_wait_s: float | None = None  # None = EP_MAX_PREDECESSOR_WAIT_SECONDS
    orphan_after_s: float | None = None  # None = EP_ORPHAN_AFTER_SECONDS
    ingestion: JobConfig = JobConfig(job_name="ingestion", predecessors=["ingestion", "mutation", "retention"])
    mutation: JobConfig = JobConfig(job_name="mutation", predecessors=["ingestion", "mutation"])
    retention: JobConfig = JobConfig(job_name="retention", predecessors=["ingestion", "mutation", "retention"])

    _coordinator: Coordinator | None = PrivateAttr(default=None)
    _session_at_first_question: bool = PrivateAttr(default=False)  # set up for a sensor: teardown closes it
    _unreachable: tuple[float, str] | None = PrivateAttr(
        default=None
    )  # (monotonic time, why) a session could not be opened

    @property
    def checkpoints(self) -> CheckpointStore:
        return self.lake.checkpoints

    @property
    def is_enabled(self) -> bool:
        return load_settings().coordinator_enabled if self.enabled is None else self.enabled

    @property
    def predecessor_wait_bound_s(self) -> float:
        return (
            load_settings().max_predecessor_wait_seconds
            if self.max_predecessor_wait_s is None
            else self.max_predecessor_wait_s
        )

    @property
    def orphan_bound_s(self) -> float:
        return load_settings().orphan_after_seconds if self.orphan_after_s is None else self.orphan_after_s

    def job_spec(self, stream: str, lock_name: str | None = None) -> JobSpec:
        """The configured spec of ingestion / mutation / retention; any other stream (an ingest
        pipeline) locks `lock_name` (default: its own name) and accepts any predecessor."""
        if stream in ENGAGEMENT_STREAMS:
            return getattr(self, stream).spec(self.predecessor_wait_bound_s)
        return JobSpec(lock_name or stream, stream)

    def coordinator(self) -> Coordinator:
        if self._coordinator is None:
            settings = load_settings()
            self._coordinator = Coordinator(
                self.hosts or settings.zookeeper_hosts,
                self.root or settings.zookeeper_root,
                self.session_timeout_s,
                settings.zookeeper_auth,
                self.reconnect_wait_s,
            )
        return self._coordinator

    def setup_for_execution(self, context: InitResourceContext) -> None:
        if not self.is_enabled:
            return
        if context.dagster_run is None:  # a sensor: its session opens at its first question; an idle tick asks none
            self._session_at_first_question = True
            return
        try:
            self.coordinator().start(self.connect_timeout_s)
        except CoordinationGaveUp as e:
            self._unreachable = (time.monotonic(), str(e))
            if context.log:
                context.log.warning(f"{e}; the batch will give up at acquire")
        run = context.dagster_run
        if run is not None:  # a run (a sensor's resources have none): hold its liveness node
            self.register_run(run.run_id, run_labels(run.job_name, run.tags), context.log)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        self.close()

    def close(self) -> None:
        """End the session: its lock znodes and the run's liveness node go with it."""
        if self._coordinator is not None:
            self._coordinator.close()
            self._coordinator = None

    def register_run(
        self, run_id: str, labels: dict[str, str], log: Any = None, connect_in_background: bool = False
    ) -> bool:
        """Hold the run's liveness node on this resource's session until `close` (see the class docstring).
        `connect_in_background`: open the session without waiting (a run that uses no lock). False, with a
        warning, while ZooKeeper is not connected: the node is created once it is."""
        if not self.is_enabled:
            return False
        zk = self.coordinator()
        registered = zk.register_run(run_id, run_liveness_info(run_id, labels))
        if connect_in_background:
            zk.start_in_background()  # after register_run: the node is created as soon as the session connects
            return registered
        if not registered and log is not None:
            log.warning(
                f"run {run_id}: no liveness node in ZooKeeper yet (not connected); it is created once the session "
                f"connects, and until then a sensor may judge this run gone {self.orphan_bound_s:g}s after its last event"
            )
        return registered

    def live_runs(self) -> frozenset[str] | None:
        """The ids of the runs whose process holds its liveness node now; None with the coordinator off (no
        run has a node); CoordinationGaveUp when ZooKeeper is unreachable (nothing can be said then)."""
        if not self.is_enabled:
            return None
        try:
            with self._asking() as zk:
                return zk.live_runs()
        except (KazooException, KazooTimeoutError) as e:
            raise CoordinationGaveUp(f"ZooKeeper unreachable: {str(e) or type(e).__name__}") from e

    @contextmanager
    def _asking(self) -> Iterator[Coordinator]:
        """The session a sensor's questions (live_runs, lock_wait, predecessor_wait) are asked on: the
        evaluation's own, opened at its first question and kept until teardown, while it is connected; else one of
        their own, closed after. For ASK_AGAIN_AFTER_S
        after a session could not be opened, questions give up at once (CoordinationGaveUp) instead of each waiting
        `connect_timeout_s` again (three such waits make a tick take 16-20 s while ZooKeeper restarts), and a tick
        on a healthy ZooKeeper opens one session, not one per question."""
        if self._unreachable is not None and time.monotonic() - self._unreachable[0] < ASK_AGAIN_AFTER_S:
            raise CoordinationGaveUp(self._unreachable[1])
        if self._coordinator is not None and self._coordinator.client.connected:
            yield self._coordinator
            return
        if self._coordinator is None and self._session_at_first_question:  # the evaluation's, closed at teardown
            try:
                self.coordinator().start(self.connect_timeout_s)
            except CoordinationGaveUp as e:
                self._unreachable = (time.monotonic(), str(e))
                self.close()
                raise
            yield self.coordinator()
            return
        settings = load_settings()
        probe = Coordinator(
            self.hosts or settings.zookeeper_hosts,
            self.root or settings.zookeeper_root,
            self.session_timeout_s,
            settings.zookeeper_auth,
        )
        try:
            try:
                probe.start(self.connect_timeout_s)
            except CoordinationGaveUp as e:
                self._unreachable = (time.monotonic(), str(e))
                raise
            yield probe
        finally:
            probe.close()

    def predecessor_wait(self, stream: str, batch_id: int, lock_name: str | None = None) -> str | None:
        """Why a run of this batch would wait right now: the lock is held ("lock <name> held by
        <owner>"), the last registered job is not an allowed predecessor yet (saying when the bounded
        wait ends), or ZooKeeper is unreachable; None if it may go. A sensor asks this before
        re-requesting a batch whose run gave up, so a stream waiting for its turn skips ticks instead
        of launching a run per tick that waits and gives up."""
        return self._turn_wait(stream, batch_id, lock_name, predecessor=True)

    def lock_wait(self, stream: str, batch_id: int, lock_name: str | None = None) -> str | None:
        """Why a run of this batch would wait for the lock right now ("lock <name> held by <owner>",
        or ZooKeeper unreachable); None if the lock is free. A sensor asks this before requesting a
        new batch's run or a retry: a run launched now would only wait."""
        return self._turn_wait(stream, batch_id, lock_name, predecessor=False)

    def turn_passed_over(self, stream: str) -> frozenset[str]:
        """The last registered jobs an idle tick of this stream replaces (Coordinator.pass_turn): see
        `turn_passed_over`. With the defaults ingestion passes over retention, and nobody else passes."""
        if stream not in ENGAGEMENT_STREAMS:
            return frozenset()
        mine = getattr(self, stream)
        jobs = [getattr(self, name) for name in ENGAGEMENT_STREAMS]
        # Only the jobs that share its lock register on the same predecessor znode.
        sets = {job.job_name: frozenset(job.predecessors) for job in jobs if job.lock_name == mine.lock_name}
        return turn_passed_over(mine.job_name, sets)

    def pass_turn(self, stream: str, lock_name: str | None = None) -> str | None:
        """On an idle tick (the stream's topic fully committed): register the stream as having run with nothing to
        do when a job that waits for it registered last, and say so for the skip reason; None when nothing was
        written (also when ZooKeeper cannot be asked: the waiting job's bounded wait still ends)."""
        over = self.turn_passed_over(stream) if self.is_enabled else frozenset()
        if not over:
            return None
        job = self.job_spec(stream, lock_name)
        try:
            with self._asking() as zk:
                replaced = zk.pass_turn(job.lock_name, job.job_name, over)
        except (CoordinationGaveUp, KazooException, KazooTimeoutError):
            return None
        if replaced is None:
            return None
        return f"passed its turn on {job.lock_name} after {replaced.get('owner') or replaced.get('job')}"

    def _turn_wait(self, stream: str, batch_id: int, lock_name: str | None, predecessor: bool) -> str | None:
        if not self.is_enabled:
            return None
        job = self.job_spec(stream, lock_name)
        try:
            with self._asking() as zk:
                holder = zk.holder(job.lock_name)  # the first contender holds the lock
                if holder is not None:
                    return f"lock {job.lock_name} held by {holder_owner(holder)}"
                if not predecessor:
                    return None
                current, registered_at = zk.registration(job.lock_name)
                owner, bound = f"{stream}/{batch_id}", job.max_predecessor_wait_s
                # Nobody registered yet (None) is allowed.
                if current is None or allowed(current, job.job_name, owner, job.predecessors):
                    return None
                age = zk.seconds_since(registered_at) if is_bounded(bound) and registered_at is not None else None
                if allowed(current, job.job_name, owner, job.predecessors, age, bound):
                    return None
        except (CoordinationGaveUp, KazooException, KazooTimeoutError) as e:
            return f"ZooKeeper unreachable: {str(e) or type(e).__name__}"
        return (
            f"last job registered on {job.lock_name} is {current.get('job')!r}, {job.job_name} may follow only "
            f"{sorted(job.predecessors)}{wait_ends(age, bound)}"
        )

    @contextmanager
    def batch(
        self,
        stream: str,
        batch_id: int,
        lock_name: str | None = None,
        on_lock_wait: Callable[[LockBusy, float], None] | None = None,
    ) -> Iterator[Lease | None]:
        """Acquire (lock + register) for one batch, yield the lease, release; None when disabled.
        The owner is the batch ("<stream>/<batch id>"), so a retry of it is its own predecessor.
        The lock is awaited up to `max_lock_wait_s`, with `on_lock_wait(busy, seconds)` after each round."""
        if not self.is_enabled:
            yield None
            return
        with self.coordinator().batch(
            self.job_spec(stream, lock_name),
            f"{stream}/{batch_id}",
            self.lock_timeout_s,
            self.max_lock_wait_s,
            on_lock_wait,
        ) as lease:
            yield lease


def run_labels(job_name: str, tags: Mapping[str, str]) -> dict[str, str]:
    """What a liveness node names about its run: the job, the stream and the partition (batch or tenant)."""
    return {
        "job": job_name,
        "stream": tags.get("engagement/stream", ""),
        "partition": tags.get("dagster/partition", ""),
    }


def platform_resources() -> dict[str, ConfigurableResource]:
    """The resources of the Definitions: one lake (its tables, and the checkpoint store behind the
    coordinator), Kafka, ZooKeeper and Spark. Each field is empty, so each resource follows the settings
    (EP_LAKE_ROOT, SPARK_REMOTE, KAFKA_BOOTSTRAP_SERVERS, ZOOKEEPER_HOSTS, EP_ZK_ROOT) at run time."""
    lake = LakeResource()
    return {
        "spark": SparkResource(),
        "lake": lake,
        "kafka": KafkaResource(),
        "coordinator": CoordinatorResource(lake=lake),
    }
