"""The ZooKeeper job coordinator against the real ZooKeeper, and its fencing of real Delta commits.

Lock, give-up and predecessor tests use the shared test ZooKeeper under a fresh root per test, as do
the tests of waiting one's turn (the bounded predecessor wait, the sensor's question about the lock, a
run that waits for the lock instead of failing). The faults that stop ZooKeeper run against this
module's own server (port OWN_ZK_PORT, own state folder), started with scripts/stack.sh and stopped at
the end, so other tests' ZooKeeper is never touched.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid
from types import SimpleNamespace

import pyarrow as pa
import pytest
from dagster import (
    AssetKey,
    DagsterInstance,
    SensorResult,
    SkipReason,
    build_resources,
    build_sensor_context,
    materialize,
)

from engagement_platform import resources as resources_module
from engagement_platform.engagement.ingestion.apply import STREAM
from engagement_platform.engagement.ingestion.assets import (
    engagement_ingestion,
    engagement_ingestion_sensor,
    ingestion_batches,
)
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake, TableSpec
from engagement_platform.orchestration import ride_out
from engagement_platform.orchestration.runs import COORDINATION_TAG, LOCK_WAIT_METADATA, run_request
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource
from engagement_platform.streams.batch import CommitStep, active_lease, commit_batch, fenced
from engagement_platform.streams.coordinator import (
    OP_TIMEOUT_S,
    CoordinationGaveUp,
    Coordinator,
    JobSpec,
    LeaseLost,
    LockBusy,
    allowed,
)
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import BatchPlan, KafkaSlice, plan_next_batch
from engagement_platform_tests.support.activities import produce_activities
from engagement_platform_tests.support.mutations import produce_requests
from engagement_platform_tests.support.stack import REPO
from engagement_platform_tests.support.streams import FiveMessages, NoSpark, clicks_stream, count_clicks, expire_session

OWN_ZK_PORT = "23181"
SESSION_S = 4.0  # ZooKeeper's minimum with tickTime=2000
LOCK = "engagement_activity"
INGESTION = JobSpec(LOCK, "ingestion", frozenset({"ingestion", "mutation", "retention"}))
MUTATION = JobSpec(LOCK, "mutation", frozenset({"ingestion", "mutation"}))
RETENTION = JobSpec(LOCK, "retention", frozenset({"mutation", "retention"}))
SCHEMA = pa.schema([("id", pa.int64()), ("batch_id", pa.int64())])
TABLES = [TableSpec(name, SCHEMA, change_data_feed=False) for name in ("fenced_a", "fenced_b")]


@pytest.fixture
def root() -> str:
    return f"/tests/coordinator/{uuid.uuid4().hex}"


@pytest.fixture
def coordinators(stack, root):
    """Coordinator factory on the shared test ZooKeeper; every one is closed at the end."""
    made = []

    def make(hosts: str = stack["ZOOKEEPER_HOSTS"]) -> Coordinator:
        made.append(Coordinator(hosts, root, session_timeout_s=SESSION_S))
        return made[-1]

    yield make
    for c in made:
        c.close()


@pytest.fixture(scope="module")
def own_zk(tmp_path_factory):
    """A ZooKeeper of our own (own port and state folder) that the fault tests stop and restart."""
    env = {**os.environ, "EP_ZK_PORT": OWN_ZK_PORT, "EP_STATE_DIR": str(tmp_path_factory.mktemp("own_zk"))}

    def ctl(action: str) -> None:
        subprocess.run(
            ["bash", str(REPO / "scripts" / "stack.sh"), action, "zookeeper"], check=True, env=env, capture_output=True
        )

    ctl("start")
    yield SimpleNamespace(hosts=f"127.0.0.1:{OWN_ZK_PORT}", start=lambda: ctl("start"), stop=lambda: ctl("stop"))
    ctl("stop")


def wait_for(predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def skipped(result) -> str | None:
    """A sensor tick's skip message (a SkipReason, or a SensorResult's skip_reason), else None."""
    if isinstance(result, SkipReason):
        return result.skip_message
    return result.skip_reason.skip_message if isinstance(result, SensorResult) and result.skip_reason else None


# ---- lock, register, unlock ---------------------------------------------------------------------


def test_lock_waits_up_to_the_timeout_then_gives_up_and_unlock_hands_it_over(coordinators):
    a, b = coordinators(), coordinators()
    held = a.lock(LOCK, "ingestion/1", timeout_s=2)
    held.check()
    b.start()  # connected first: a lock's timeout also bounds opening the session, and that is not timed here
    started = time.monotonic()
    with pytest.raises(CoordinationGaveUp, match="not obtained within"):
        b.lock(LOCK, "mutation/1", timeout_s=0.5)
    assert 0.45 <= time.monotonic() - started < 3

    # A busy lock (ZooKeeper answered) is told apart from ZooKeeper being away: it is the batch's turn that has not come.
    with pytest.raises(LockBusy) as busy:
        b.lock(LOCK, "mutation/1", timeout_s=0.2)
    assert '"owner": "ingestion/1"' in busy.value.holder

    # A waiter gets the lock as soon as the holder releases it, with a larger fencing token.
    waiter = threading.Timer(0.3, a.unlock, [held])
    waiter.start()
    got = b.lock(LOCK, "mutation/1", timeout_s=5)
    waiter.join()
    assert got.token > held.token
    with pytest.raises(LeaseLost):
        held.check()
    b.unlock(got)
    with pytest.raises(LeaseLost):
        got.check()


def test_register_accepts_only_allowed_predecessors_and_a_retry_of_the_same_batch(coordinators):
    c = coordinators()

    def register(job: JobSpec, owner: str) -> None:
        with c.batch(job, owner, timeout_s=2):
            pass

    register(RETENTION, "retention/1")  # nobody registered yet: anyone may start
    register(RETENTION, "retention/2")  # allowed to follow itself (a backlog drains at its own cadence)
    with pytest.raises(CoordinationGaveUp, match="last registered job is 'retention'"):
        register(MUTATION, "mutation/1")  # not directly after retention
    register(INGESTION, "ingestion/1")  # ingestion may follow anyone
    with pytest.raises(CoordinationGaveUp, match="expected one of \\['mutation', 'retention'\\]"):
        register(RETENTION, "retention/3")  # TTL waits for the ID rewrites
    register(MUTATION, "mutation/1")
    register(RETENTION, "retention/3")
    assert c.last_registered(LOCK)["owner"] == "retention/3"

    # A batch that registered and then crashed is retried: its own record never blocks it, even
    # when its job is not in its own predecessor set.
    strict = JobSpec(LOCK, "mutation", frozenset({"ingestion"}))
    register(INGESTION, "ingestion/2")
    register(strict, "mutation/2")
    register(strict, "mutation/2")  # the retry
    with pytest.raises(CoordinationGaveUp):
        register(strict, "mutation/3")  # the next batch is a different owner

    # The give-up released the lock: someone else gets it at once.
    other = coordinators()
    other.start()
    other.unlock(other.lock(LOCK, "ingestion/3", timeout_s=1))


def test_an_idle_job_passes_its_turn_only_over_another_jobs_record_and_only_while_the_lock_is_free(coordinators):
    c, other = coordinators(), coordinators()
    c.start()
    over = frozenset({"retention"})
    assert c.pass_turn(LOCK, "ingestion", over) is None, "nobody registered yet: nothing to pass"
    with other.batch(RETENTION, "retention/1", timeout_s=2):
        assert c.pass_turn(LOCK, "ingestion", over) is None, "a batch holds the lock"
    replaced = c.pass_turn(LOCK, "ingestion", over)
    assert replaced is not None and replaced["owner"] == "retention/1"
    assert c.last_registered(LOCK)["owner"] == "ingestion/idle"
    assert c.pass_turn(LOCK, "ingestion", over) is None, "already the last registered job"
    with other.batch(MUTATION, "mutation/1", timeout_s=2):
        pass  # mutation may follow ingestion, idle or not
    assert c.pass_turn(LOCK, "ingestion", over) is None, "mutation is not a job anyone waits behind"
    assert c.last_registered(LOCK)["owner"] == "mutation/1"


def test_passing_a_turn_gives_way_to_a_registration_that_races_it(coordinators, monkeypatch):
    c, intruder = coordinators(), coordinators()
    with c.batch(RETENTION, "retention/1", timeout_s=2):
        pass
    intruder.start()
    real_get = c.client.get_async

    def get_then_race(path, *args, **kwargs):
        result = real_get(path, *args, **kwargs)
        result.get()
        intruder.client.set(path, b'{"job": "retention", "owner": "retention/2"}')
        return result

    monkeypatch.setattr(c.client, "get_async", get_then_race)
    assert c.pass_turn(LOCK, "ingestion", frozenset({"retention"})) is None
    monkeypatch.undo()
    assert c.last_registered(LOCK)["owner"] == "retention/2"


def test_an_idle_job_passes_over_only_the_jobs_that_hold_back_a_job_waiting_for_it(stack, root, tmp_path):
    defaults = resource(stack, root, tmp_path)
    passed = {s: defaults.turn_passed_over(s) for s in ("ingestion", "mutation", "retention", "rewards_members")}
    # Mutation waits for ingestion after retention; an idle mutation must not let the next mutation skip ingestion.
    assert passed == {
        "ingestion": {"retention"},
        "mutation": frozenset(),
        "retention": frozenset(),
        "rewards_members": frozenset(),
    }
    # Mutation allowed after anything: nobody waits for ingestion.
    relaxed = resource(stack, root, tmp_path, mutation=resources_module.JobConfig(job_name="mutation", predecessors=[]))
    assert not relaxed.turn_passed_over("ingestion")
    # Mutation on a lock of its own: its rule reads another znode, which ingestion never writes.
    apart = resource(
        stack,
        root,
        tmp_path,
        mutation=resources_module.JobConfig(lock_name="elsewhere", job_name="mutation", predecessors=["ingestion"]),
    )
    assert not apart.turn_passed_over("ingestion")
    # Retention only after mutation or itself (TTL waits for the ID rewrites): an idle mutation lets it go after
    # ingestion; an idle ingestion passes over nothing, since replacing retention would block retention's next batch.
    sets = {job.job_name: job.predecessors for job in (INGESTION, MUTATION, RETENTION)}
    assert resources_module.turn_passed_over("mutation", sets) == {"ingestion"}
    assert resources_module.turn_passed_over("ingestion", sets) == frozenset()


def test_register_is_a_compare_and_swap_on_the_predecessor_znode(coordinators, monkeypatch):
    c, intruder = coordinators(), coordinators()
    with c.batch(INGESTION, "ingestion/1", timeout_s=2):
        pass
    lease = c.lock(LOCK, "mutation/1", timeout_s=2)
    intruder.start()
    real_get = c.client.get_async

    def get_then_race(path, *args, **kwargs):
        result = real_get(path, *args, **kwargs)
        result.get()  # our read is done...
        intruder.client.set(path, b'{"job": "ingestion", "owner": "ingestion/2"}')  # a write between read and swap
        return result

    monkeypatch.setattr(c.client, "get_async", get_then_race)
    with pytest.raises(CoordinationGaveUp, match="changed concurrently"):
        c.register(lease, "mutation", MUTATION.predecessors)
    monkeypatch.undo()
    assert c.last_registered(LOCK)["owner"] == "ingestion/2"
    c.unlock(lease)


def test_concurrent_contenders_never_hold_the_lock_together(coordinators):
    contenders = [coordinators() for _ in range(3)]
    holding: list[str] = []
    intervals: list[tuple[float, float, int]] = []
    errors: list[BaseException] = []
    guard = threading.Lock()

    def work(c: Coordinator, name: str) -> None:
        try:
            for i in range(4):
                lease = c.lock(LOCK, f"{name}/{i}", timeout_s=20)
                with guard:
                    holding.append(name)
                    assert len(holding) == 1, f"two holders: {holding}"
                began = time.monotonic()
                time.sleep(0.02)
                with guard:
                    holding.remove(name)
                intervals.append((began, time.monotonic(), lease.token))
                c.unlock(lease)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(c, f"job{i}")) for i, c in enumerate(contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    intervals.sort()
    assert len(intervals) == 12
    for (_, end, token), (start, _, next_token) in zip(intervals, intervals[1:]):
        assert end <= start and token < next_token  # no overlap; tokens grow with every holder


# ---- fencing of Delta commits -------------------------------------------------------------------


def plan(batch_id: int = 1) -> BatchPlan:
    return BatchPlan("ingestion", batch_id, KafkaSlice("test.topic", (OffsetRange(0, 0, 3),)))


def steps(lake, batch: BatchPlan, after_first=None) -> list[CommitStep]:
    rows = pa.table({"id": [1, 2, 3], "batch_id": [batch.batch_id] * 3}, schema=SCHEMA)

    def commit(spec: TableSpec, fault):
        def run(txn, outcomes):
            version = lake.append(spec, rows, txn)
            if fault:
                fault()
            return version

        return run

    return [CommitStep(spec.name, commit(spec, after_first if i == 0 else None)) for i, spec in enumerate(TABLES)]


def run_batch(
    c: Coordinator,
    lake,
    checkpoints,
    batch: BatchPlan,
    after_first=None,
    job: JobSpec = INGESTION,
    timeout_s: float = 10,
):
    """One batch through the lifecycle: acquire, fenced commits, release."""
    with c.batch(job, f"{batch.stream}/{batch.batch_id}", timeout_s=timeout_s) as lease, fenced(lease):
        return commit_batch(batch, "test.fenced", steps(lake, batch, after_first), checkpoints)


def commits(lake, name: str) -> list[dict]:
    return [h for h in lake.table(name).history() if h.get("app_id") == "test.fenced"]


def assert_committed_exactly_once(lake, checkpoints, batch: BatchPlan) -> None:
    for spec in TABLES:
        assert lake.read(spec.name).num_rows == 3, spec.name
        assert lake.committed_version(spec.name, "test.fenced") == batch.batch_id
        assert len(commits(lake, spec.name)) == 1
    assert checkpoints.is_done(batch.stream, batch.batch_id)


def test_commits_carry_the_fencing_token_and_a_lost_lease_commits_nothing(coordinators, lake, checkpoints):
    c = coordinators()
    batch = plan()
    checkpoints.record_plan(batch)
    lease = c.lock(LOCK, "ingestion/1", timeout_s=2)
    with fenced(lease):
        expire_session(c)
        with pytest.raises(LeaseLost):
            commit_batch(batch, "test.fenced", steps(lake, batch), checkpoints)
    assert not lake.exists("fenced_a")

    run_batch(c, lake, checkpoints, batch)
    assert_committed_exactly_once(lake, checkpoints, batch)
    (meta,) = commits(lake, "fenced_a")
    assert int(meta["fencing_token"]) > lease.token
    assert meta["lock_name"] == LOCK and meta["lock_owner"] == "ingestion/1"

    # Without a lease (coordinator off) commits are unfenced, as before.
    second = plan(2)
    checkpoints.record_plan(second)
    commit_batch(second, "test.fenced", steps(lake, second), checkpoints)
    assert "fencing_token" not in commits(lake, "fenced_a")[0]


# ---- faults with the real server: each ends with the batch committed exactly once, later ----------


def test_zookeeper_restart_during_a_batch(own_zk, lake, checkpoints, root):
    own_zk.start()
    # A server away for longer than the lease check waits for it: the run gives up before its next commit.
    c = Coordinator(own_zk.hosts, root, session_timeout_s=SESSION_S, reconnect_wait_s=SESSION_S)
    try:
        batch = plan()
        checkpoints.record_plan(batch)
        with pytest.raises(LeaseLost):
            run_batch(
                c, lake, checkpoints, batch, after_first=own_zk.stop
            )  # first table committed, then ZooKeeper goes
        assert lake.read("fenced_a").num_rows == 3 and not lake.exists("fenced_b")
        assert not checkpoints.is_done(batch.stream, batch.batch_id)

        own_zk.start()
        run_batch(c, lake, checkpoints, batch)  # the next tick: the same plan, only the missing table is written
        assert_committed_exactly_once(lake, checkpoints, batch)
    finally:
        c.close()


def test_a_zookeeper_restart_shorter_than_the_session_is_waited_out_and_the_batch_commits_in_the_same_run(
    own_zk, lake, checkpoints, root
):
    """The most common fault: a server restart suspends the connection for a few seconds, and a run that gave its
    batch up then would lose it for nothing, as the session (and so the lock znode) survives it. The lease check waits (up to
    reconnect_wait_s) for the same session to come back, then commits under the same fencing token."""
    own_zk.start()
    c = Coordinator(own_zk.hosts, root, session_timeout_s=30.0)
    try:
        batch = plan()
        checkpoints.record_plan(batch)
        suspended = []

        def restart():
            own_zk.stop()
            wait_for(lambda: c.client.state != "CONNECTED")
            suspended.append(c.client.state)
            own_zk.start()

        with c.batch(INGESTION, "ingestion/1", timeout_s=10) as lease, fenced(lease):
            session = c.client.client_id
            commit_batch(batch, "test.fenced", steps(lake, batch, after_first=restart), checkpoints)
        assert suspended == ["SUSPENDED"] and c.client.client_id == session, "the same session came back"
        assert_committed_exactly_once(lake, checkpoints, batch)
        assert {int(commits(lake, t.name)[0]["fencing_token"]) for t in TABLES} == {lease.token}
    finally:
        c.close()


def test_a_zookeeper_restart_longer_than_the_session_timeout_keeps_the_session_and_the_batch_commits(
    own_zk, lake, checkpoints, root
):
    """A ZooKeeper restart longer than the 10 s session timeout must not fail the runs holding a lock ("session
    suspended for 10s"): a restarted server restores its sessions and gives each a full timeout again. The lease
    check waits up to reconnect_wait_s for the same session with the lock znode still ours, and the batch commits
    under its fencing token in the same run."""
    own_zk.start()
    c = Coordinator(own_zk.hosts, root, session_timeout_s=SESSION_S, reconnect_wait_s=60.0)
    try:
        batch = plan()
        checkpoints.record_plan(batch)
        stopped, restart = [], threading.Timer(SESSION_S + 3, own_zk.start)

        def long_restart():  # the server goes down after the first commit and comes back after the session timeout
            own_zk.stop()
            stopped.append(time.monotonic())
            restart.start()

        with c.batch(INGESTION, "ingestion/1", timeout_s=10) as lease, fenced(lease):
            session = c.client.client_id
            commit_batch(batch, "test.fenced", steps(lake, batch, after_first=long_restart), checkpoints)
            committed = time.monotonic()
        restart.join()
        # The second table's lease check waited across the whole outage, longer than the session timeout.
        assert committed - stopped[0] > SESSION_S + 3 and c.client.client_id == session, (
            "the same session came back after the timeout"
        )
        assert_committed_exactly_once(lake, checkpoints, batch)
        assert {int(commits(lake, t.name)[0]["fencing_token"]) for t in TABLES} == {lease.token}
    finally:
        c.close()


def test_session_expiry_while_holding_the_lock(own_zk, lake, checkpoints, root):
    own_zk.start()
    zombie = Coordinator(own_zk.hosts, root, session_timeout_s=SESSION_S)
    other = Coordinator(own_zk.hosts, root, session_timeout_s=SESSION_S)
    try:
        batch = plan()
        checkpoints.record_plan(batch)
        taken = {}

        def expire_and_take_over():
            expire_session(zombie)
            # The lock is free the moment the session is gone: another stream takes it.
            taken["lease"] = other.lock(LOCK, "mutation/1", timeout_s=5)

        with pytest.raises(LeaseLost):
            run_batch(zombie, lake, checkpoints, batch, after_first=expire_and_take_over)
        assert not lake.exists("fenced_b")  # the zombie did not write past the takeover
        other.unlock(taken["lease"])

        run_batch(zombie, lake, checkpoints, batch)
        assert_committed_exactly_once(lake, checkpoints, batch)
        assert int(commits(lake, "fenced_b")[0]["fencing_token"]) > taken["lease"].token
    finally:
        zombie.close()
        other.close()


def test_zookeeper_down_when_a_tick_starts_is_waited_for_within_the_lock_timeout(own_zk, lake, checkpoints, root):
    own_zk.start()
    batch = plan()
    checkpoints.record_plan(batch)
    own_zk.stop()
    c = Coordinator(own_zk.hosts, root, session_timeout_s=SESSION_S)
    try:
        started = time.monotonic()
        with pytest.raises(CoordinationGaveUp, match="unreachable"):
            run_batch(c, lake, checkpoints, batch, timeout_s=3)
        assert time.monotonic() - started < 3 + 6
        assert not lake.exists("fenced_a") and not checkpoints.is_done(batch.stream, batch.batch_id)

        # A server that comes back within the lock's timeout is waited for: the same call commits.
        starter = threading.Thread(target=own_zk.start)
        starter.start()
        try:
            run_batch(c, lake, checkpoints, batch, timeout_s=60)
        finally:
            starter.join()
        assert_committed_exactly_once(lake, checkpoints, batch)
    finally:
        c.close()


def test_zookeeper_going_away_while_waiting_for_the_lock_is_a_bounded_give_up(own_zk, root):
    own_zk.start()
    holder = Coordinator(own_zk.hosts, root, session_timeout_s=SESSION_S)
    waiter = Coordinator(own_zk.hosts, root, session_timeout_s=SESSION_S)
    try:
        holder.lock(LOCK, "mutation/1", timeout_s=2)
        stopper = threading.Timer(0.3, own_zk.stop)
        stopper.start()
        started = time.monotonic()
        with pytest.raises(CoordinationGaveUp):
            waiter.lock(LOCK, "ingestion/1", timeout_s=1)  # kazoo's recipe alone would wait for the server
        # Bounded, not quick: the watchdog's give-up joins kazoo's connection thread while the server is killed.
        assert time.monotonic() - started < 1 + OP_TIMEOUT_S + 10
        stopper.join()
    finally:
        holder.close()
        waiter.close()
        own_zk.start()


# ---- Dagster: a give-up fails the run without committing and does not use up attempts -------------


def test_stream_run_gives_up_while_the_lock_is_held_then_commits_fenced(
    spark, stack, kafka, topic, lake_root, checkpoints, root
):
    produce_activities(kafka, topic, 20)
    lake = LakeResource(root=lake_root)
    # The run waits for the lock at most max_lock_wait_s in all (a short bound here), then gives up.
    coordinator = CoordinatorResource(
        lake=lake, root=root, enabled=True, lock_timeout_s=0.5, max_lock_wait_s=0.5, session_timeout_s=SESSION_S
    )
    resources = {
        "kafka": KafkaResource(bootstrap_servers=stack["KAFKA_BOOTSTRAP_SERVERS"]),
        "lake": lake,
        "coordinator": coordinator,
        "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]}),
    }
    holder = Coordinator(stack["ZOOKEEPER_HOSTS"], root, session_timeout_s=SESSION_S)
    with DagsterInstance.ephemeral() as instance:

        def tick():
            with build_sensor_context(instance=instance, resources=resources) as ctx:
                return engagement_ingestion_sensor(ctx)

        request = tick().run_requests[0]
        instance.add_dynamic_partitions(ingestion_batches.name, [request.partition_key])
        for _ in range(4):  # more give-ups than MAX_ATTEMPTS: the stream must not pause
            held = holder.lock(LOCK, "mutation/1", timeout_s=2)
            out = materialize(
                [engagement_ingestion],
                partition_key=request.partition_key,
                instance=instance,
                tags=request.tags,
                resources=resources,
                raise_on_error=False,
            )
            assert not out.success
            assert instance.get_run_by_id(out.run_id).tags[COORDINATION_TAG] == "gave_up"
            # While the lock is held the sensor launches no retry (it would only wait): it says who holds it.
            assert f"lock {LOCK} held by mutation/1" in skipped(tick())
            holder.unlock(held)
            retry = tick()
            assert isinstance(retry, SensorResult) and retry.run_requests, retry
            request = retry.run_requests[0]
        assert request.run_key.endswith("#attempt5")
        assert not os.path.exists(os.path.join(lake_root, "engagement_activity"))
        holder.close()

        out = materialize(
            [engagement_ingestion],
            partition_key=request.partition_key,
            instance=instance,
            tags=request.tags,
            resources=resources,
        )
        assert out.success
    history = [h for h in LakeResource(root=lake_root).lake.table("engagement_activity").history() if h.get("app_id")]
    assert (
        history[0]["lock_name"] == LOCK
        and history[0]["lock_owner"] == f"{STREAM}/1"
        and int(history[0]["fencing_token"]) > held.token
    )


def mutation_after_retention(stack, kafka, lake_root, root, monkeypatch, max_predecessor_wait_s: float):
    """A mutation request on a fresh topic, the resources of a coordinated mutation stream with this predecessor
    bound, and a retention batch registered last on the lock (mutation may follow only ingestion or mutation).
    Returns (topic, coordinator resource, resources, the other ZooKeeper client)."""
    mutation_topic = f"test.mutations.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({mutation_topic: 1})
    monkeypatch.setenv("EP_MUTATIONS_TOPIC", mutation_topic)
    produce_requests(
        kafka,
        mutation_topic,
        [
            {
                "request_id": "r1",
                "org_id": "o1",
                "request_time": "2026-02-01T00:00:00Z",
                "op": "convert",
                "from_field": "lead_id",
                "from_id": "00QNOTYET",
                "to_field": "contact_id",
                "to_id": "003LATER",
            },
        ],
    )
    lake = LakeResource(root=lake_root)
    coordinator = CoordinatorResource(
        lake=lake,
        root=root,
        enabled=True,
        lock_timeout_s=2,
        session_timeout_s=SESSION_S,
        max_predecessor_wait_s=max_predecessor_wait_s,
    )
    resources = {
        "kafka": KafkaResource(bootstrap_servers=stack["KAFKA_BOOTSTRAP_SERVERS"]),
        "lake": lake,
        "coordinator": coordinator,
        "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]}),
    }
    other = Coordinator(stack["ZOOKEEPER_HOSTS"], root, session_timeout_s=SESSION_S)
    with other.batch(JobSpec(LOCK, "retention"), "retention/1", timeout_s=2):
        pass  # a retention batch registered last
    return mutation_topic, coordinator, resources, other


def test_a_run_the_predecessor_rule_refuses_waits_out_the_bounded_wait_and_commits(
    spark, stack, kafka, lake_root, root, monkeypatch
):
    """The rule changed between the tick and the run (a retention batch registered meanwhile): the run
    waits, lock released, until the bounded wait ends, then commits: no red run."""
    from engagement_platform.engagement.mutation.assets import engagement_mutation, mutation_batches

    bound = 8.0  # the run's set-up must fit inside it, on a loaded machine too, for the run to meet the rule
    mutation_topic, coordinator, resources, other = mutation_after_retention(
        stack, kafka, lake_root, root, monkeypatch, max_predecessor_wait_s=bound
    )
    plan = plan_next_batch("mutation", mutation_topic, None, kafka.watermarks(mutation_topic), 1000)
    coordinator.checkpoints.record_plan(plan)
    request = run_request(plan, 1, {})
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(mutation_batches.name, [request.partition_key])
        started = time.monotonic()
        with other.batch(JobSpec(LOCK, "retention"), "retention/2", timeout_s=10):
            pass  # registered again now, so the bound starts here and not before the test's own set-up
        out = materialize(
            [engagement_mutation],
            partition_key=request.partition_key,
            instance=instance,
            tags=request.tags,
            resources=resources,
            raise_on_error=False,
        )
        assert out.success, "waiting one's turn is not a failure"
        assert COORDINATION_TAG not in instance.get_run_by_id(out.run_id).tags
        assert time.monotonic() - started >= bound - 0.1, "it waited for the bound"
        logs = [e.message for e in instance.all_logs(out.run_id) if e.message]
        assert any("waits for its turn" in m and "'retention'" in m for m in logs), logs
    assert coordinator.checkpoints.is_done("mutation", plan.batch_id)
    other.close()


def test_sensor_holds_a_batch_that_gave_up_until_its_predecessor_rule_allows_it(
    spark, stack, kafka, lake_root, root, monkeypatch
):
    """Mutation may follow only {ingestion, mutation}: after a retention batch, its give-up is not
    re-requested on every tick (run spam) but held with a reason, until ingestion registers."""
    from engagement_platform.engagement.mutation.assets import (
        engagement_mutation,
        engagement_mutation_sensor,
        mutation_batches,
    )

    # A bound far beyond the test's duration: here the wait ends because ingestion registers.
    mutation_topic, coordinator, resources, other = mutation_after_retention(
        stack, kafka, lake_root, root, monkeypatch, max_predecessor_wait_s=3600
    )
    with DagsterInstance.ephemeral() as instance:

        def tick():
            with build_sensor_context(instance=instance, resources=resources) as ctx:
                return engagement_mutation_sensor(ctx)

        def skipped(result) -> str:
            assert not getattr(result, "run_requests", None), result
            return result.skip_message if hasattr(result, "skip_message") else result.skip_reason.skip_message

        # A new batch is not launched while the rule forbids it (no red run), and its plan is not recorded.
        assert "waits for its turn" in skipped(tick())
        assert coordinator.checkpoints.latest_plan("mutation") is None
        # A run that gives up anyway (the rule changed between the tick and the run) is held the same way.
        plan = plan_next_batch("mutation", mutation_topic, None, kafka.watermarks(mutation_topic), 1000)
        coordinator.checkpoints.record_plan(plan)
        request = run_request(plan, 1, {})
        instance.add_dynamic_partitions(mutation_batches.name, [request.partition_key])
        out = materialize(
            [engagement_mutation],
            partition_key=request.partition_key,
            instance=instance,
            tags=request.tags,
            resources=resources,
            raise_on_error=False,
        )
        assert instance.get_run_by_id(out.run_id).tags[COORDINATION_TAG] == "gave_up"
        for _ in range(2):  # held on every tick while the rule forbids it, no run launched
            message = skipped(tick())
            assert "waits for its turn" in message and "'retention'" in message, message
        with other.batch(JobSpec(LOCK, "ingestion"), "ingestion/1", timeout_s=2):
            pass  # an ingestion batch registers: mutation may follow it now
        retry = tick().run_requests[0]
        assert retry.run_key.endswith("#attempt2")
        out = materialize(
            [engagement_mutation],
            partition_key=retry.partition_key,
            instance=instance,
            tags=retry.tags,
            resources=resources,
        )
        assert out.success
    other.close()


def test_a_mutation_batch_after_retention_goes_once_ingestion_finds_nothing_to_ingest(
    spark, stack, kafka, lake_root, root, monkeypatch
):
    """Mutation waits after retention for fresh activities; an ingestion topic with nothing uncommitted has none
    to bring, so ingestion's idle tick passes its turn and the mutation batch is launched without the bounded wait."""
    from engagement_platform.engagement.mutation.assets import engagement_mutation_sensor

    _, _, resources, other = mutation_after_retention(stack, kafka, lake_root, root, monkeypatch, 3600)
    activities = f"test.activities.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({activities: 1})
    monkeypatch.setenv("EP_ACTIVITIES_TOPIC", activities)
    with DagsterInstance.ephemeral() as instance:

        def tick(sensor):
            with build_sensor_context(instance=instance, resources=resources) as ctx:
                return sensor(ctx)

        assert "waits for its turn" in skipped(tick(engagement_mutation_sensor))
        message = skipped(tick(engagement_ingestion_sensor))
        assert "no new messages" in message and f"passed its turn on {LOCK} after retention/1" in message, message
        assert other.last_registered(LOCK)["owner"] == "ingestion/idle"
        requested = tick(engagement_mutation_sensor)
        assert isinstance(requested, SensorResult) and requested.run_requests, requested
        assert "passed its turn" not in skipped(tick(engagement_ingestion_sensor)), "once is enough"
    other.close()


# ---- waiting one's turn: bounded predecessor wait, no run while the lock is held, a run waits for the lock ----


def test_allowed_counts_any_last_job_as_a_predecessor_once_the_bounded_wait_has_passed():
    retention = {"job": "retention", "owner": "retention/1"}
    assert not allowed(retention, "mutation", "mutation/3", MUTATION.predecessors)
    assert not allowed(
        retention, "mutation", "mutation/3", MUTATION.predecessors, registered_s_ago=119.9, max_wait_s=120
    )
    assert allowed(retention, "mutation", "mutation/3", MUTATION.predecessors, registered_s_ago=120, max_wait_s=120)
    assert not allowed(
        retention, "mutation", "mutation/3", MUTATION.predecessors, registered_s_ago=1e9, max_wait_s=float("inf")
    )
    assert not allowed(
        retention, "mutation", "mutation/3", MUTATION.predecessors, registered_s_ago=1e9, max_wait_s=None
    )


def resource(stack, root, tmp_path, **fields) -> CoordinatorResource:
    return CoordinatorResource(
        lake=LakeResource(root=str(tmp_path / "lake")),
        hosts=stack["ZOOKEEPER_HOSTS"],
        root=root,
        enabled=True,
        session_timeout_s=SESSION_S,
        **fields,
    )


def test_a_job_refused_by_the_predecessor_rule_registers_once_the_bounded_wait_has_passed(
    coordinators, stack, root, tmp_path
):
    """After a retention batch, with no ingestion batch coming, a mutation batch waits for its turn
    only `max_predecessor_wait_s` (by ZooKeeper's clock), then registers; the sensor's question says
    how long the wait still lasts, then lets the batch go."""
    bound = 8.0  # the refused batch and the sensor's question must both land inside it, on a loaded machine too
    c = coordinators()
    c.start()
    bounded = JobSpec(LOCK, "mutation", MUTATION.predecessors, max_predecessor_wait_s=bound)
    coordinator = resource(stack, root, tmp_path, max_predecessor_wait_s=bound)
    registered = time.monotonic()  # before the registration: the bound cannot have passed sooner than this
    with c.batch(RETENTION, "retention/1", timeout_s=2):
        pass

    with pytest.raises(CoordinationGaveUp, match="last registered job is 'retention'.*the wait ends in"):
        with c.batch(bounded, "mutation/3", timeout_s=2):
            pass
    waiting = coordinator.predecessor_wait("mutation", 3)
    assert (
        waiting is not None
        and "'retention'" in waiting
        and "the wait ends in" in waiting
        and f"bound {bound:g}s" in waiting
    ), waiting
    assert coordinator.lock_wait("mutation", 3) is None  # the lock itself is free

    wait_for(lambda: coordinator.predecessor_wait("mutation", 3) is None, timeout_s=bound + 10)
    assert time.monotonic() - registered >= bound - 0.1  # not before the bound
    with pytest.raises(CoordinationGaveUp, match="last registered job is 'retention'"):
        with c.batch(MUTATION, "mutation/3", timeout_s=2):
            pass  # without a bound the rule stays strict
    with c.batch(bounded, "mutation/3", timeout_s=2):
        pass
    assert c.last_registered(LOCK)["owner"] == "mutation/3"


def test_the_sensor_question_reports_the_lock_holder_until_it_releases(coordinators, stack, root, tmp_path):
    coordinator = resource(stack, root, tmp_path)
    assert coordinator.lock_wait("mutation", 1) is None and coordinator.predecessor_wait("mutation", 1) is None
    holder = coordinators()
    held = holder.lock(LOCK, "ingestion/4", timeout_s=2)
    assert coordinator.lock_wait("mutation", 1) == f"lock {LOCK} held by ingestion/4"
    assert coordinator.predecessor_wait("mutation", 1) == f"lock {LOCK} held by ingestion/4"
    holder.unlock(held)
    assert coordinator.lock_wait("mutation", 1) is None and coordinator.predecessor_wait("mutation", 1) is None


class CountedSessions(Coordinator):
    """The real Coordinator, counting the sessions it is asked to open (ZooKeeper answers or not as it is)."""

    started: list[str] = []

    def start(self, timeout_s: float = 5.0) -> None:
        CountedSessions.started.append(self.hosts)
        super().start(timeout_s)


@pytest.mark.parametrize("zookeeper", ["up", "away"])
def test_one_sensor_evaluation_asks_all_its_questions_on_one_zookeeper_session(
    zookeeper, coordinators, stack, root, tmp_path, monkeypatch
):
    """A tick asks whether the lock is free and which runs are alive. It asks on the session its resource opened
    at setup, not on one more session per question; and once ZooKeeper did not answer, later questions of the
    tick give up at once instead of each waiting out the connect timeout again (otherwise: 16-20 s ticks while
    ZooKeeper restarts, every other sensor waiting behind them)."""
    monkeypatch.setattr(resources_module, "Coordinator", CountedSessions)
    monkeypatch.setattr(CountedSessions, "started", [])
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        away = f"127.0.0.1:{s.getsockname()[1]}"
    hosts = stack["ZOOKEEPER_HOSTS"] if zookeeper == "up" else away
    holder = coordinators()
    held = holder.lock(LOCK, "ingestion/4", timeout_s=2)
    try:
        coordinator = CoordinatorResource(
            lake=LakeResource(root=str(tmp_path / "lake")),
            hosts=hosts,
            root=root,
            enabled=True,
            session_timeout_s=SESSION_S,
            # Up: time to connect on a loaded machine (a slow handshake is not what this tests). Away: fail fast.
            connect_timeout_s=10.0 if zookeeper == "up" else 1.0,
        )
        with build_resources({"coordinator": coordinator}) as built:  # setup and teardown, as for a sensor's tick
            answers = [built.coordinator.lock_wait("mutation", 1), built.coordinator.predecessor_wait("mutation", 1)]
            if zookeeper == "up":
                assert answers == [f"lock {LOCK} held by ingestion/4"] * 2
                assert holder.register_run("run-1", {"run_id": "run-1"})
                assert "run-1" in built.coordinator.live_runs()
            else:
                assert all(
                    a.startswith(f"ZooKeeper unreachable: ZooKeeper {away} unreachable within 1s") for a in answers
                ), answers
                with pytest.raises(CoordinationGaveUp, match="unreachable"):
                    built.coordinator.live_runs()
    finally:
        holder.unlock(held)
    assert CountedSessions.started == [hosts]
    without_setup = CoordinatorResource(
        lake=LakeResource(root=str(tmp_path / "lake")),
        hosts=hosts,
        root=root,
        enabled=True,
        session_timeout_s=SESSION_S,
        connect_timeout_s=10.0 if zookeeper == "up" else 1.0,
    )
    # A resource without setup (orphans.liveness_probe's) opens a session per question.
    expected = None if zookeeper == "up" else f"ZooKeeper unreachable: ZooKeeper {away} unreachable within 1s"
    assert (
        without_setup.lock_wait("mutation", 1) == expected and without_setup.predecessor_wait("mutation", 1) == expected
    )
    assert len(CountedSessions.started) == (3 if zookeeper == "up" else 2)
    monkeypatch.setattr(resources_module, "ASK_AGAIN_AFTER_S", 0.0)  # later than that, ZooKeeper is asked again
    without_setup.lock_wait("mutation", 1)
    assert len(CountedSessions.started) == (4 if zookeeper == "up" else 3)


CLICKS_LOCK = "demo_clicks_table"


def test_a_stream_sensor_requests_no_run_while_the_lock_is_held(coordinators, stack, root, tmp_path):
    stream = clicks_stream(lock_name=CLICKS_LOCK)
    lake = LakeResource(root=str(tmp_path / "lake"))
    resources = {"kafka": FiveMessages(bootstrap_servers="unused:9092"), "coordinator": resource(stack, root, tmp_path)}
    holder = coordinators()
    with DagsterInstance.ephemeral() as instance:

        def tick():
            with build_sensor_context(instance=instance, resources=resources) as ctx:
                return stream.sensor(ctx)

        held = holder.lock(CLICKS_LOCK, "backfill/1", timeout_s=2)
        waiting = tick()  # a new batch: nothing planned while the lock is held
        assert not getattr(waiting, "run_requests", None), waiting
        assert skipped(waiting) == f"clicks batch 1 waits for its turn: lock {CLICKS_LOCK} held by backfill/1"
        assert lake.checkpoints.latest_plan("clicks") is None
        holder.unlock(held)

        first = tick()
        assert first.run_requests and first.run_requests[0].partition_key == "00000001"
        held = holder.lock(CLICKS_LOCK, "backfill/2", timeout_s=2)
        assert (
            skipped(tick()) == f"clicks batch 1 waits for its turn: lock {CLICKS_LOCK} held by backfill/2"
        )  # nor a re-request
        holder.unlock(held)
        assert tick().run_requests[0].run_key == first.run_requests[0].run_key


def test_a_run_that_finds_the_lock_held_waits_its_turn_and_commits_with_the_wait_in_its_metadata(
    coordinators, stack, root, tmp_path
):
    """Lock timeout 0.5 s, lock held by another client until the run has waited for it at least 2.6 s: the run
    does not fail, it waits (logging each round), commits, and its materialization says how long it waited."""
    stream = clicks_stream(lock_name=CLICKS_LOCK, run_batch=count_clicks)
    lake_root = str(tmp_path / "lake")
    plan = BatchPlan("clicks", 1, KafkaSlice("demo.clicks", (OffsetRange(0, 0, 5),)))
    CheckpointStore(DeltaLake(lake_root)).record_plan(plan)
    lake = LakeResource(root=lake_root)
    coordinator = CoordinatorResource(
        lake=lake,
        hosts=stack["ZOOKEEPER_HOSTS"],
        root=root,
        enabled=True,
        session_timeout_s=SESSION_S,
        lock_timeout_s=0.5,
        max_lock_wait_s=60,
    )
    holder = coordinators()
    held = holder.lock(CLICKS_LOCK, "backfill/1", timeout_s=2)

    def release_once_the_run_waited() -> None:
        # Timed from the run's own contender znode, not from now: a run's set-up time varies with the machine's load.
        recipe = holder.client.Lock(f"{holder.root}/locks/{CLICKS_LOCK}")
        deadline = time.monotonic() + 60
        while len(recipe.contenders()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.6)
        holder.unlock(held)

    release = threading.Thread(target=release_once_the_run_waited)
    release.start()
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(stream.partitions.name, [plan.partition_key])
        out = materialize(
            [stream.asset],
            partition_key=plan.partition_key,
            instance=instance,
            raise_on_error=False,
            resources={
                "spark": NoSpark(),
                "lake": lake,
                "kafka": KafkaResource(bootstrap_servers="unused:9092"),
                "coordinator": coordinator,
            },
        )
        logs = [e.user_message for e in instance.all_logs(out.run_id)]
        tags = instance.get_run_by_id(out.run_id).tags
    release.join()
    assert out.success, logs
    assert COORDINATION_TAG not in tags
    (metadata,) = [
        m.metadata for m in out.asset_materializations_for_node("demo_clicks") if m.asset_key == AssetKey("demo_clicks")
    ]
    assert 2.5 <= metadata[LOCK_WAIT_METADATA].value < 60
    assert metadata["records_read"].value == 5
    waits = [m for m in logs if f"waits for its turn: lock {CLICKS_LOCK} held by" in m]
    assert len(waits) >= 2 and "backfill/1" in waits[0], logs


# ---- a run rides out passing faults: it tries its batch again from the plan, in the same run ---------


def clicks_run_that_loses_its_lease(lake_root: str, expirations: int):
    """The clicks stream whose batch commits the two fenced tables, its first `expirations` attempts losing the
    ZooKeeper session between the two commits (a real expiry on the real server), and the attempts' leases."""
    leases = []

    def commit_then_expire(ctx, plan):
        leases.append(active_lease())
        expire = (lambda: expire_session(ctx.coordinator)) if len(leases) <= expirations else None
        commit_batch(plan, "test.fenced", steps(ctx.lake, plan, after_first=expire), ctx.checkpoints)
        return count_clicks(ctx, plan)

    plan = BatchPlan("clicks", 1, KafkaSlice("demo.clicks", (OffsetRange(0, 0, 5),)))
    CheckpointStore(DeltaLake(lake_root)).record_plan(plan)
    return clicks_stream(lock_name=LOCK, run_batch=commit_then_expire), plan, leases


def materialize_clicks(stream, plan, lake_root: str, coordinator: CoordinatorResource):
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(stream.partitions.name, [plan.partition_key])
        out = materialize(
            [stream.asset],
            partition_key=plan.partition_key,
            instance=instance,
            raise_on_error=False,
            resources={
                "spark": NoSpark(),
                "lake": coordinator.lake,
                "kafka": KafkaResource(bootstrap_servers="unused:9092"),
                "coordinator": coordinator,
            },
        )
        return out, [e.user_message for e in instance.all_logs(out.run_id)], instance.get_run_by_id(out.run_id).tags


def run_losing_the_lease_once(stack, root: str, lake_root: str, monkeypatch, ride_out_faults_s: float):
    """The clicks run whose first attempt loses its session between the two fenced commits, materialized with this
    ride-out bound (pauses shortened): (plan, the attempts' leases, the result, its log messages, its run tags)."""
    monkeypatch.setattr(ride_out, "RIDE_OUT_PAUSES_S", (0.2,))
    stream, plan, leases = clicks_run_that_loses_its_lease(lake_root, expirations=1)
    coordinator = CoordinatorResource(
        lake=LakeResource(root=lake_root),
        hosts=stack["ZOOKEEPER_HOSTS"],
        root=root,
        enabled=True,
        session_timeout_s=SESSION_S,
        ride_out_faults_s=ride_out_faults_s,
    )
    return (plan, leases, *materialize_clicks(stream, plan, lake_root, coordinator))


def test_a_run_whose_lease_is_lost_mid_batch_tries_again_in_the_same_run_and_commits_once(
    stack, root, tmp_path, monkeypatch
):
    """A lost lease (a session expiry, a run paused past it) or ZooKeeper away does not fail the run (its batch would
    wait minutes for a new run behind the others in the run queue, all red in the UI): the run tries again from
    the batch's plan. The first attempt committed fenced_a and lost its session before fenced_b; the second takes the lock on a new session, skips fenced_a (its txn is there) and commits fenced_b."""
    lake_root = str(tmp_path / "lake")
    plan, leases, out, logs, tags = run_losing_the_lease_once(stack, root, lake_root, monkeypatch, ride_out_faults_s=60)
    assert out.success, logs
    assert COORDINATION_TAG not in tags
    (metadata,) = [
        m.metadata for m in out.asset_materializations_for_node("demo_clicks") if m.asset_key == AssetKey("demo_clicks")
    ]
    assert metadata["attempts_in_run"].value == 2
    assert any("lease lost" in m and "attempt 2 in this run" in m for m in logs if m), logs
    lake, checkpoints = DeltaLake(lake_root), CheckpointStore(DeltaLake(lake_root))
    assert_committed_exactly_once(lake, checkpoints, plan)
    first, second = leases
    assert second.session_id != first.session_id and second.token > first.token
    assert int(commits(lake, "fenced_a")[0]["fencing_token"]) == first.token  # committed once, by the first attempt
    assert int(commits(lake, "fenced_b")[0]["fencing_token"]) == second.token


def test_faults_that_outlast_the_ride_out_bound_fail_the_run_as_a_coordination_failure(
    stack, root, tmp_path, monkeypatch
):
    """With no time to ride faults out (ride_out_faults_s=0) the run fails at the first lost lease, tagged so it
    does not count as an attempt; the sensor's retry finishes the batch (fenced_b is still missing)."""
    lake_root = str(tmp_path / "lake")
    plan, leases, out, logs, tags = run_losing_the_lease_once(stack, root, lake_root, monkeypatch, ride_out_faults_s=0)
    assert not out.success and tags[COORDINATION_TAG] == "lease_lost"
    assert len(leases) == 1
    lake = DeltaLake(lake_root)
    assert lake.exists("fenced_a") and not lake.exists("fenced_b")
    assert not CheckpointStore(lake).is_done(plan.stream, plan.batch_id)
