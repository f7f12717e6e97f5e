"""Soak benchmark: the platform (its stack and the Dagster daemon with every sensor) under a deterministic workload
(workload.py) while faults are injected (faults.py), then every table reconciled with an independent oracle
(oracle.py, reconcile.py).

    .venv/bin/python -m benchmarks.soak --seed 7 --minutes 5 --faults 20 [--max-concurrent-faults 2 | --spaced]

Its own stack (ZooKeeper 24181, broker 24092, Spark Connect 24102: neither the default, the tests' nor the other
benchmarks' ports, and below Linux's ephemeral range, 32768-60999, where a client socket of the test stack took
45102 once and the short soak's Spark server could not bind it) and state folder (.state/soak-<seed>, wiped at start; logs under logs/). It produces a round every
--round-seconds for --minutes while the faults happen (a round's landing file is landed under EP_LANDING_ROOT as a
producer must), sends what the last rounds scheduled, then waits (at most --catch-up-minutes) until the platform is
caught up: every stream has committed its topic, every landed file's batch is done, no run is queued or in flight,
every tenant's staging is merged and no mutation request is pending, for --settle-seconds in a row. Then it
reads the topics back, stops Dagster and the stack, and reconciles. Exit status 1 on any lost, duplicated, wrong or
unaccounted record, failing check, broken workload assumption, or when it did not catch up.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._stack import REPO, machine
from benchmarks.record import invocation, record_result
from benchmarks.soak.faults import Daemon, Injector, Sample, plan_faults, resumed_seconds, stack
from benchmarks.soak.reconcile import reconcile
from benchmarks.soak.workload import (
    ACTIVITIES,
    GDPR,
    LANDING,
    MUTATIONS,
    PROFILE_CDC,
    PROFILE_ERASURE,
    PROFILE_ERASURES,
    PROFILES,
    Gate,
    LandingFile,
    Message,
    Workload,
)
from engagement_platform.streams.kafka import ReplacingProducer

PORTS = {"EP_ZK_PORT": "24181", "EP_KAFKA_PORT": "24092", "EP_SPARK_CONNECT_PORT": "24102"}
SERVERS = ["zookeeper", "kafka", "spark"]
# stream -> its topic: what gates wait for and catching up needs committed. The profile_erasure stream's sensor runs
# like every sensor (default RUNNING), and create-topics makes its topic.
STREAMS = {
    "ingestion": ACTIVITIES,
    "mutation": MUTATIONS,
    "retention": GDPR,
    PROFILE_CDC: PROFILES,
    PROFILE_ERASURE: PROFILE_ERASURES,
}
LANDING_STREAM = f"ingest.{LANDING}"  # the landing pipeline's stream in the checkpoint store (landing/apply.py)


PENDING_MAX_AGE_S = 240.0


def environment(state: Path, args) -> dict[str, str]:
    """What run_platform.sh exports, on the soak's ports and folder, with faster failure handling."""
    return {
        **os.environ,
        **PORTS,
        "EP_STATE_DIR": str(state),
        "EP_LAKE_ROOT": str(state / "lake"),
        "EP_LANDING_ROOT": str(state / "landing"),
        "DAGSTER_HOME": str(state / "dagster_home"),
        "EP_ZK_ROOT": "/soak",
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{PORTS['EP_KAFKA_PORT']}",
        "ZOOKEEPER_HOSTS": f"127.0.0.1:{PORTS['EP_ZK_PORT']}",
        "SPARK_REMOTE": f"sc://127.0.0.1:{PORTS['EP_SPARK_CONNECT_PORT']}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "EP_ORPHAN_AFTER_SECONDS": "20",  # a killed run is retried after 20 s rather than a minute
        "EP_RETENTION_INTERVAL_SECONDS": "60",  # the default is daily; here a batch a minute at most (the others: --batch-wait)
        # a batch per stream every --batch-wait seconds: a run per sensor tick would not fit 2 cores
        "EP_BATCH_MIN_RECORDS": "1000000",
        "EP_BATCH_MAX_WAIT_SECONDS": str(args.batch_wait),
        # a request whose late target never comes expires within the catch-up window (default 72 h); the
        # oracle takes the requests that expired as an input, so expiring more of them changes nothing else
        "EP_MUTATION_PENDING_MAX_AGE_HOURS": str(args.pending_max_age_seconds / 3600),
    }


def committed_offsets(latest, done: bool) -> dict[int, int]:
    """Per partition, the offset a stream has committed up to (planning.uncommitted_records' rule)."""
    if latest is None:
        return {}
    return latest.ends() if done else {r.partition: r.start for r in latest.ranges}


class Sender:
    """Sends the workload in order. A gated message waits in its topic's queue (the gated messages after it
    behind it) until its gate opens; ungated ones go at once. Delivery reports give each message's partition and
    offset, which a gate compares with what the stream has committed. The producer survives a broker that lost
    its state in a restart (streams/kafka.py ReplacingProducer); a copy it sends again may
    land twice, which the oracle takes as any producer retry (it reads what the topics hold)."""

    def __init__(self, new_producer: Callable[[], Any], topics: dict[str, str]):
        self.producer, self.topics = ReplacingProducer(new_producer), topics  # logical topic -> Kafka topic
        self.waiting = {t: deque() for t in topics}
        self.ends: dict[tuple[str, int], dict[int, int]] = {}  # (topic, round) -> partition -> last offset + 1
        self.outstanding: Counter = Counter()  # (topic, round) -> produced, not reported yet
        self.failed: list[tuple[Message, str]] = []
        self.incidents = self.producer.replaced

    def send(self, messages: list[Message], committed: dict[str, dict[int, int]]) -> None:
        for m in messages:
            if m.gate is None:
                self.produce(m)
            else:
                self.waiting[m.topic].append(m)
        self.pump(committed)

    def pump(self, committed: dict[str, dict[int, int]]) -> None:
        self.producer.poll(0)
        for queue in self.waiting.values():
            while queue and self.is_open(queue[0].gate, committed):
                self.produce(queue.popleft())

    def flush(self, timeout: float) -> None:
        self.producer.flush(timeout)

    def is_open(self, gate: Gate, committed: dict[str, dict[int, int]]) -> bool:
        # Only what was produced counts: a gated message still waiting (an erased subject's later activity) is no
        # request's target, so nothing needs it committed first. Unless the gate says `queued`: a later change of an
        # erased profile waits for its erasure request, which may itself still wait for its gate.
        if gate.queued and any(m.round <= gate.round for m in self.waiting.get(gate.topic, ())):
            return False
        rounds = [tr for tr in set(self.ends) | set(self.outstanding) if tr[0] == gate.topic and tr[1] <= gate.round]
        if any(self.outstanding[tr] for tr in rounds):
            return False
        have = committed.get(gate.stream, {})
        return all(have.get(p, 0) >= end for tr in rounds for p, end in self.ends.get(tr, {}).items())

    def unsent(self) -> int:
        return sum(len(q) for q in self.waiting.values()) + sum(self.outstanding.values())

    def produce(self, m: Message) -> None:
        def delivered(err, msg):
            self.outstanding[(m.topic, m.round)] -= 1
            if err is not None:
                self.failed.append((m, str(err)))
            else:
                ends = self.ends.setdefault((m.topic, m.round), {})
                ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

        self.outstanding[(m.topic, m.round)] += 1
        while True:
            try:
                self.producer.produce(self.topics[m.topic], value=m.value, key=m.key, on_delivery=delivered)
                return
            except BufferError:  # the local queue is full (the broker is down): wait for deliveries
                self.producer.poll(0.5)


def land_files(files: list[LandingFile], landing_root: str) -> list[LandingFile]:
    """Each file in its pipeline's folder the way a producer must land it: written under a dot-name, then moved in
    (files.land), so the sensor never plans a file still being written. Returns `files`."""
    from engagement_platform.landing.files import land

    for f in files:
        land(f"{landing_root}/{LANDING}", f.name, f.data)
    return files


class Observer:
    """Samples each stream's committed offsets (checkpoint store) and its topic's high watermarks (broker), and says
    what still keeps the platform from being caught up."""

    def __init__(self, env: dict[str, str]):
        from engagement_platform.lake.checkpoints import CheckpointStore
        from engagement_platform.lake.delta import DeltaLake
        from engagement_platform.settings import load_settings
        from engagement_platform.streams.kafka import KafkaClient

        settings = load_settings(env)
        self.client = KafkaClient(settings.kafka_bootstrap_servers, settings.kafka_config)
        self.lake = DeltaLake(settings.lake_root, settings.storage_options or None)
        self.store = CheckpointStore(self.lake)
        self.topics = {
            ACTIVITIES: settings.ingestion.topic,
            MUTATIONS: settings.mutation.topic,
            GDPR: settings.retention.topic,
            PROFILES: settings.profiles.cdc_topic,
            PROFILE_ERASURES: settings.profiles.erasure_topic,
        }
        self.last = Sample(0.0, {}, {})

    def sample(self, t: float) -> Sample:
        committed, highs = dict(self.last.committed), dict(self.last.highs)
        try:
            latest = self.store.latest_of(list(STREAMS))
            committed = {stream: committed_offsets(*latest[stream]) for stream in STREAMS}
        except Exception:  # a table being created, a transient read error: keep the last sample's
            pass
        for stream, topic in STREAMS.items():
            try:
                highs[stream] = {
                    p: high for p, (_, high) in self.client.watermarks(self.topics[topic], timeout=5).items()
                }
            except Exception:  # the broker is down (a fault): keep the last sample's, do not wait on every topic
                break
        self.last = Sample(t, committed, highs)
        return self.last

    def ingested_files(self) -> int:
        """Landing files whose batch is done: a batch reads the files waiting when it was planned, one batch in
        flight at a time, so every plan but an unfinished latest one is done."""
        from engagement_platform.landing.apply import planned_files

        plans = self.store.plans(LANDING_STREAM)  # a plan recorded after this read counts as waiting, as it should
        if not plans:
            return 0
        latest = max(plans, key=lambda p: p.batch_id)
        unfinished = 0 if self.store.is_done(LANDING_STREAM, latest.batch_id) else len(planned_files(latest))
        return sum(len(planned_files(p)) for p in plans) - unfinished

    def busy(self, instance, landed: int = 0) -> list[str]:
        """`landed`: how many landing files the soak landed (a file not planned yet shows in no run)."""
        from dagster import DagsterRunStatus, RunsFilter

        from engagement_platform.engagement.mutation.tables import ENGAGEMENT_MUTATIONS_PENDING
        from engagement_platform.profiles.processor.progress import unprocessed_tenants

        s, reasons = self.last, []
        for stream in STREAMS:
            behind = sum(
                max(high - s.committed.get(stream, {}).get(p, 0), 0) for p, high in s.highs.get(stream, {}).items()
            )
            reasons += [f"{stream}: {behind} uncommitted"] if behind or stream not in s.highs else []
        in_flight = [
            DagsterRunStatus.QUEUED,
            DagsterRunStatus.NOT_STARTED,
            DagsterRunStatus.STARTING,
            DagsterRunStatus.STARTED,
            DagsterRunStatus.CANCELING,
        ]
        runs = instance.get_runs_count(RunsFilter(statuses=in_flight))
        reasons += [f"{runs} runs queued or in flight"] if runs else []
        try:
            tenants = unprocessed_tenants(self.lake)
            pending = (
                self.lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).num_rows
                if self.lake.exists(ENGAGEMENT_MUTATIONS_PENDING.name)
                else 0
            )
            waiting = landed - self.ingested_files()
        except Exception as exc:  # a commit in flight: ask again next time
            return reasons + [f"lake not readable: {exc!r}"[:200]]
        return (
            reasons
            + ([f"tenants with unmerged staging: {tenants}"] if tenants else [])
            + ([f"{pending} pending requests"] if pending else [])
            + ([f"{waiting} landing files not ingested"] if waiting else [])
        )

    def read_back(self) -> Counter:
        """(logical topic, value) -> copies on the topic now."""
        from engagement_platform.streams.kafka import OffsetRange

        found = Counter()
        for logical, topic in self.topics.items():
            ranges = [OffsetRange(p, low, high) for p, (low, high) in self.client.watermarks(topic).items()]
            found.update((logical, m.value) for m in self.client.read_range(topic, ranges, timeout=300))
        return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--minutes", type=float, default=5.0, help="how long rounds are produced and faults injected")
    parser.add_argument(
        "--faults", type=int, default=20, help="faults planned over the window (those that do not fit are reported)"
    )
    parser.add_argument("--max-concurrent-faults", type=int, default=1, help="faults active at once (one per target)")
    parser.add_argument(
        "--spaced",
        action="store_true",
        help="one fault at a time, each once the platform is back to committing after the one before (planned moments ignored)",
    )
    parser.add_argument(
        "--every-kind",
        action="store_true",
        help="plan each kind in turn (a shuffled order, repeated), as --spaced does, faults still overlapping: "
        "a short soak meets every kind",
    )
    parser.add_argument(
        "--fault-minutes",
        type=float,
        help="plan the faults within the first this many minutes of the window (default: all of it), so that the "
        "last ones still find a free slot and target before the window closes",
    )
    parser.add_argument(
        "--pending-max-age-seconds",
        type=float,
        default=PENDING_MAX_AGE_S,
        help="EP_MUTATION_PENDING_MAX_AGE_HOURS in seconds: catching up must outlast it after the last mutation batch "
        "that held a request back whose target the broker lost",
    )
    parser.add_argument("--round-seconds", type=float, default=2.0)
    parser.add_argument(
        "--sample-seconds", type=float, default=5.0, help="how often committed offsets and watermarks are read"
    )
    parser.add_argument(
        "--batch-wait", type=int, default=20, help="EP_BATCH_MAX_WAIT_SECONDS: a batch per stream this often"
    )
    parser.add_argument("--catch-up-minutes", type=float, default=10.0)
    parser.add_argument("--settle-seconds", type=float, default=30.0)
    args = parser.parse_args()

    state = REPO / ".state" / f"soak-{args.seed}"
    env = environment(state, args)
    stack("stop", SERVERS, env, check=False)  # a previous soak's servers in this folder, by their pid files
    shutil.rmtree(state, ignore_errors=True)
    (state / "logs").mkdir(parents=True)
    (state / "dagster_home").mkdir()
    (state / "landing").mkdir()  # EP_LANDING_ROOT: the workload's landing files land under it
    shutil.copy(REPO / "dagster.yaml", state / "dagster_home" / "dagster.yaml")
    os.environ.update(env)  # this process reads the same lake, broker and Dagster instance
    print(f"machine: {machine()}; state {state}", flush=True)
    started = stack("start", SERVERS, env, check=False)
    if started.returncode != 0:
        print(started.stdout.decode()[-2000:], started.stderr.decode()[-2000:], sep="\n")
        stack("stop", SERVERS, env, check=False)
        return 2
    daemon = Daemon(env, state / "logs" / "dagster-daemon.log")
    try:
        subprocess.run(
            [sys.executable, "-m", "engagement_platform.cli", "create-topics"], cwd=REPO, env=env, check=True
        )
        daemon.start()
        outcome = soak(args, env, daemon)
    finally:
        daemon.stop()
        stack("stop", SERVERS, env, check=False)
    status = reconcile(**outcome, env=env)
    record(args, outcome, status)
    return status


def record(args, outcome: dict, status: int) -> None:
    """The run's headline figures as a benchmark record; the 2-minute bound is on each kind's median recovery."""
    medians = [
        statistics.median(done) if (done := [t for t in times if t is not None]) else None
        for times in resumed_seconds(outcome["faults"], outcome["samples"]).values()
    ]
    record_result(
        "soak",
        invocation(),
        f"seed {args.seed}, {args.minutes:g} minutes, {args.faults} faults planned, "
        + ("one at a time" if args.spaced else f"at most {args.max_concurrent_faults} at once"),
        {
            "verdict": "PASS" if status == 0 else "FAIL",
            "faults_injected": sum(f.injected is not None for f in outcome["faults"]),
            "faults_planned": len(outcome["faults"]),
            "messages": len(outcome["messages"]),
            **(
                {
                    "back_to_committing_best_median_s": round(min(m for m in medians if m is not None)),
                    "back_to_committing_worst_median_s": "never" if None in medians else round(max(medians)),
                }
                if any(m is not None for m in medians)
                else {}
            ),
        },
        target={"verdict": "== PASS", "back_to_committing_worst_median_s": "<= 120"},
    )


def soak(args, env: dict[str, str], daemon: Daemon) -> dict:
    from dagster import DagsterInstance

    observer = Observer(env)
    workload = Workload(seed=args.seed)
    sender = Sender(observer.client.producer, observer.topics)  # idempotent: a broker restart neither loses nor repeats
    window = args.minutes * 60
    start, samples, incidents = time.monotonic(), [], []
    faults = plan_faults(
        random.Random(args.seed * 1_000_003),
        args.faults,
        window if args.fault_minutes is None else min(window, args.fault_minutes * 60),
        every_kind_in_turn=args.spaced or args.every_kind,
    )  # own stream: same workload
    injector = Injector(
        faults,
        start,
        window,
        env,
        daemon,
        random.Random(args.seed + 1),
        args.max_concurrent_faults,
        spaced=samples if args.spaced else None,
    )

    def wait_until(t: float) -> None:
        """Sample, send what gates let through, and watch the daemon until `t` seconds after the start."""
        while True:
            now = time.monotonic() - start
            if not samples or now - samples[-1].t >= args.sample_seconds:
                samples.append(observer.sample(now))
            sender.pump(samples[-1].committed)
            if daemon.exited_by_itself():
                incidents.append(
                    f"{now:.0f} s: the dagster daemon exited by itself ({daemon.process.returncode}); restarted"
                )
                daemon.start()
            if now >= t:
                return
            time.sleep(min(0.2, t - now))

    injector.start()
    rounds, landed = int(window / args.round_seconds), []
    try:
        for i in range(rounds):
            sender.send(workload.next_round(), samples[-1].committed if samples else {})
            landed += land_files(workload.landing[len(landed) :], env["EP_LANDING_ROOT"])  # the round's file, if any
            wait_until((i + 1) * args.round_seconds)
        for i, messages in enumerate(workload.remaining_rounds()):
            sender.send(messages, samples[-1].committed)
            wait_until((rounds + i + 1) * args.round_seconds)
    finally:
        injector.halt.set()
        injector.join()  # a fault in progress clears first (a server it stopped is started again)
    print(
        f"{time.monotonic() - start:.0f} s: produced {len(workload.messages)} messages in {workload.round} rounds, landed "
        f"{len(landed)} files; {sender.unsent()} waiting for their gate",
        flush=True,
    )

    deadline, settled_since, caught_up = time.monotonic() + args.catch_up_minutes * 60, None, False
    with DagsterInstance.get() as instance:
        while time.monotonic() < deadline:
            wait_until(time.monotonic() - start + 5)
            sender.flush(5)
            reasons = ([f"{sender.unsent()} messages unsent"] if sender.unsent() else []) + observer.busy(
                instance, len(landed)
            )
            settled_since = (settled_since or time.monotonic()) if not reasons else None
            if settled_since and time.monotonic() - settled_since >= args.settle_seconds:
                caught_up = True
                break
            print(f"{time.monotonic() - start:.0f} s: catching up: {'; '.join(reasons) or 'settling'}", flush=True)
    print(
        f"{time.monotonic() - start:.0f} s: {'caught up' if caught_up else 'NOT caught up'}; reading the topics back",
        flush=True,
    )
    on_topic = observer.read_back()
    return {
        "messages": workload.messages,
        "on_topic": on_topic,
        "faults": faults,
        "samples": samples,
        "caught_up": caught_up,
        "failed_sends": [f"{m.topic} message {m.index}: {err}" for m, err in sender.failed],
        "incidents": incidents + sender.incidents,
        "landed": landed,
        "window_s": window,
    }


if __name__ == "__main__":
    sys.exit(main())
