"""Ingestion throughput: Kafka -> Spark (kafka_offsets source, parse, validate) -> delta-rs commits.

    .venv/bin/python benchmarks/ingest.py [--events 2000000] [--per-partition 250000] [--no-scaling] [--lake local|s3]
    at three times the input, in as many batches three times the size (whether the serial share holds):
        .venv/bin/python benchmarks/ingest.py --events 6000000 --per-partition 750000
    (without --per-partition: three times as many batches of the default size; --no-scaling skips the cluster run)

Produces the events to a fresh local broker, then ingests them in planned batches exactly as the
sensor-launched runs do (plan -> read -> validate -> data + quarantine + notifications + checkpoint).
Prints events/s from the first read to the last commit; the Spark Connect server start is reported
separately. Baseline in the same run: reading the same offsets with confluent-kafka alone. It prints the
driver's share of all CPU the machine spent (the driver only plans and commits) and, from Spark's task metrics
(spark_metrics.py), the run's task seconds, the driver's serial seconds (no Spark job running), and the speedup
Amdahl's law gives for 2, 8 and 32 executors (the model and its limits: spark_metrics.py). Then the same offsets
again into a fresh lake with the Connect server on a two-worker standalone cluster (scripts/stack.sh spark-master,
spark-worker-1, spark-worker-2 on the bench ports; executors in their own processes, one core each) against the run
on local[2]: the throughput ratio, what the cluster's serialization and second JVM cost, the same split for the
cluster run and the tasks each executor ran. The stack's stop at the end stops the cluster too.
With `--lake s3` the same offsets also go into a lake on a local S3 endpoint (moto_server, started beside
the stack), with the same Spark session: events/s there and the ratio to the local-disk run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stack import (  # noqa: E402
    PORTS,
    bench_stack,
    machine,
    machine_busy_seconds,
    own_cpu_seconds,
    s3_lake,
    start_cluster,
    wait_for_broker_idle,
)
from record import invocation, record_result  # noqa: E402
from spark_metrics import SparkMetrics, Split  # noqa: E402
from task_phases import kafka_task_phases, phases_line  # noqa: E402

from engagement_platform.engagement.demo import ActivityGenerator  # noqa: E402
from engagement_platform.engagement.ingestion.apply import STREAM, ingest_batch  # noqa: E402
from engagement_platform.engagement.ingestion.records import ingestion_pipeline  # noqa: E402
from engagement_platform.engagement.ingestion.write_task import write_task  # noqa: E402
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY  # noqa: E402
from engagement_platform.ingest.pipeline import Pipeline  # noqa: E402
from engagement_platform.lake.checkpoints import CheckpointStore  # noqa: E402
from engagement_platform.lake.delta import DeltaLake  # noqa: E402
from engagement_platform.spark.session import build_session  # noqa: E402
from engagement_platform.streams.kafka import KafkaClient, OffsetRange  # noqa: E402
from engagement_platform.streams.planning import plan_next_batch  # noqa: E402

TOPIC = "bench.engagement.activities"
# the bounds ingestion is held to on this 2-core machine; with --lake s3, the object store's share of local disk
TARGET = {
    "events_per_s": ">= 100000",
    "ratio_to_baseline": ">= 0.4",
    "driver_cpu_share": "<= 0.25",
    "serial_share": "<= 0.15",
    "cluster_ratio_to_local2": ">= 0.8",
}
S3_TARGET = {"s3_ratio_to_local": ">= 0.5"}


@dataclass
class IngestRun:
    batches: int
    appended: int
    rejected: int
    files: int
    seconds: float
    phases: dict[str, float]
    driver_cpu: float
    machine_cpu: float
    split: Split


def ingest_all(
    spark, env: dict, marks: dict, per_partition: int, lake_dir: str, storage_options: dict | None = None
) -> IngestRun:
    """Every planned batch of the topic into a fresh lake (a folder of the bench state, or an object-store
    URI), as the sensor-launched runs do."""
    lake = DeltaLake(lake_dir if "://" in lake_dir else str(Path(env["EP_STATE_DIR"]) / lake_dir), storage_options)
    store = CheckpointStore(lake)
    appended = rejected = batches = 0
    phases: dict[str, float] = {}
    metrics = SparkMetrics(PORTS["EP_SPARK_UI_PORT"])
    before = metrics.snapshot()
    cpu0, busy0, t = own_cpu_seconds(), machine_busy_seconds(), time.perf_counter()
    while (plan := plan_next_batch(STREAM, TOPIC, store.latest_plan(STREAM), marks, per_partition)) is not None:
        store.record_plan(plan)
        result = ingest_batch(spark, lake, store, env["KAFKA_BOOTSTRAP_SERVERS"], plan)
        appended += result.rows_appended
        rejected += result.rows_rejected
        batches += 1
        for k, v in result.seconds.items():
            phases[k] = phases.get(k, 0.0) + v
    seconds = time.perf_counter() - t
    driver, busy = own_cpu_seconds() - cpu0, machine_busy_seconds() - busy0
    split = metrics.split_since(before)
    return IngestRun(
        batches, appended, rejected, len(lake.file_stats("engagement_activity")), seconds, phases, driver, busy, split
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--per-partition", type=int, default=250_000, help="batch bound per Kafka partition")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--orgs", type=int, default=1000)
    parser.add_argument("--no-scaling", action="store_true", help="skip the second run, on the two-worker cluster")
    parser.add_argument(
        "--lake",
        choices=["local", "s3"],
        default="local",
        help="s3: the same events again into a lake on a local S3 endpoint (moto), compared with local disk",
    )
    args = parser.parse_args()

    load_before = os.getloadavg()
    with bench_stack("ingest") as env:
        kafka = KafkaClient(env["KAFKA_BOOTSTRAP_SERVERS"])
        kafka.create_topics({TOPIC: args.partitions})
        gen = ActivityGenerator(seed=11, orgs=args.orgs, bad_ratio=0.001)
        t = time.perf_counter()
        kafka.produce(TOPIC, (gen.message() for _ in range(args.events)))
        produce_s = time.perf_counter() - t
        settle_s = wait_for_broker_idle(env["EP_STATE_DIR"])
        marks = kafka.watermarks(TOPIC)
        total = sum(h for _, h in marks.values())
        avg_bytes = None

        t = time.perf_counter()
        read = 0
        size = 0
        for msg in kafka.read_range(TOPIC, [OffsetRange(p, lo, hi) for p, (lo, hi) in marks.items()]):
            read += 1
            size += len(msg.value)
        baseline_s = time.perf_counter() - t
        avg_bytes = size / max(read, 1)

        t = time.perf_counter()
        spark = build_session({"spark.remote": env["SPARK_REMOTE"]}, shared=False)
        spark.range(1).count()
        connect_s = time.perf_counter() - t

        run = ingest_all(spark, env, marks, args.per_partition, "lake")
        phase_lake = DeltaLake(str(Path(env["EP_STATE_DIR"]) / "task-phases"))
        phase_lake.ensure(ENGAGEMENT_ACTIVITY)
        writes = write_task(phase_lake.uri(ENGAGEMENT_ACTIVITY.name), "phases-b0000000001", 1, datetime.now(UTC), True)
        phases = kafka_task_phases(
            env["KAFKA_BOOTSTRAP_SERVERS"],
            TOPIC,
            0,
            marks[0][0],
            min(marks[0][1], marks[0][0] + args.per_partition),
            Pipeline.from_config(ingestion_pipeline(TOPIC)),
            ("write", lambda rows: list(writes(iter(rows.to_batches())))),
        )
        on_s3 = None
        if args.lake == "s3":
            with s3_lake() as (bucket, options):
                endpoint_cpu = options.pop("cpu_seconds")
                cpu0 = endpoint_cpu()
                on_s3 = ingest_all(spark, env, marks, args.per_partition, f"{bucket}/ingest", options)
                endpoint_s = endpoint_cpu() - cpu0
        spark.stop()  # before the stack stops: a client left open kept the process alive at exit
        on_cluster = None
        if not args.no_scaling:  # the same offsets again, the tasks in executors of a two-worker cluster
            start_cluster()
            clustered = build_session({"spark.remote": env["SPARK_REMOTE"]}, shared=False)
            clustered.range(1).count()
            executors = SparkMetrics(PORTS["EP_SPARK_UI_PORT"]).wait_for_executors(2)
            on_cluster = ingest_all(clustered, env, marks, args.per_partition, "lake-cluster")
            clustered.stop()
    print(f"machine: {machine()}")
    print(f"load average before: {load_before[0]:.2f}, after: {os.getloadavg()[0]:.2f}")
    print(
        f"input: {total:,} events ({avg_bytes:.0f} B avg) on {args.partitions} partitions, {args.orgs} orgs; batches of <= {args.per_partition:,}/partition"
    )
    print(f"stack start (ZooKeeper not needed; broker + Spark Connect server JVM): {env['stack_start_seconds']:.1f} s")
    print(
        f"produce: {produce_s:.1f} s ({total / produce_s:,.0f} events/s); then {settle_s:.0f} s until the broker finished persisting"
    )
    print(f"spark connect session + first job: {connect_s:.2f} s")
    print(
        f"ingest: {run.batches} batches, {run.appended:,} appended, {run.rejected:,} quarantined, {run.files} data files"
    )
    print(
        f"ingest: {run.seconds:.1f} s first read -> last commit = {total / run.seconds:,.0f} events/s "
        "(" + ", ".join(f"{k} {v:.1f} s" for k, v in run.phases.items()) + ")"
    )
    print(
        f"driver CPU: {run.driver_cpu:.1f} s of {run.machine_cpu:.1f} CPU seconds the machine spent during the ingest "
        f"= {run.driver_cpu / run.machine_cpu:.0%}"
    )
    print(f"split on local[2]: {run.split.line()}")
    print(phases_line(phases))
    if on_cluster is not None:
        print(
            f"two-worker cluster ({executors} executors): {on_cluster.seconds:.1f} s, local[2] {run.seconds:.1f} s: "
            "throughput ratio "
            f"{run.seconds / on_cluster.seconds:.2f} (driver CPU share {on_cluster.driver_cpu / on_cluster.machine_cpu:.0%})"
        )
        print(f"split on the cluster: {on_cluster.split.line()}")
    if on_s3 is not None:
        print(
            f"lake on S3 (moto_server on 127.0.0.1): {on_s3.seconds:.1f} s = {total / on_s3.seconds:,.0f} events/s, "
            f"{on_s3.batches} batches, {on_s3.files} data files; ratio to local disk in this run: {run.seconds / on_s3.seconds:.2f} "
            "("
            + ", ".join(f"{k} {v:.1f} s" for k, v in on_s3.phases.items())
            + f"); the S3 endpoint itself used {endpoint_s:.1f} CPU s "
            f"of the {on_s3.machine_cpu:.1f} the machine spent ({endpoint_s / on_s3.machine_cpu:.0%})"
        )
    print(
        f"baseline (confluent-kafka exact-range read only, no parse/write): {baseline_s:.1f} s = {total / baseline_s:,.0f} events/s"
    )
    print(f"ratio ingest/baseline throughput: {baseline_s / run.seconds:.2f}")
    assert run.appended + run.rejected == total, "every event is appended or quarantined"
    scaling = (
        {
            "cluster_s": round(on_cluster.seconds, 1),
            "cluster_ratio_to_local2": round(run.seconds / on_cluster.seconds, 2),
            **on_cluster.split.figures("cluster_"),
        }
        if on_cluster is not None
        else {}
    )
    s3 = (
        {
            "s3_s": round(on_s3.seconds, 1),
            "s3_events_per_s": round(total / on_s3.seconds),
            "s3_ratio_to_local": round(run.seconds / on_s3.seconds, 2),
            "endpoint_cpu_share": round(endpoint_s / on_s3.machine_cpu, 2),
        }
        if on_s3 is not None
        else {}
    )
    record_result(
        "ingest",
        invocation(),
        f"{total:,} events ({avg_bytes:.0f} B), {args.partitions} partitions, {args.orgs} orgs; {run.batches} batches "
        f"of <= {args.per_partition:,}/partition" + ("; local disk, then a local S3 endpoint" if s3 else ""),
        {
            "ingest_s": round(run.seconds, 1),
            "events_per_s": round(total / run.seconds),
            "ratio_to_baseline": round(baseline_s / run.seconds, 2),
            "driver_cpu_share": round(run.driver_cpu / run.machine_cpu, 2),
            **{f"task_cpu_us_{k}": v for k, v in phases.items() if k != "records"},
            **run.split.figures(),
            **scaling,
            **s3,
        },
        target=S3_TARGET if s3 else TARGET,
        baseline={"what": "confluent-kafka exact-range read only", "events_per_s": round(total / baseline_s)},
        load_before=load_before[0],
    )


if __name__ == "__main__":
    main()
