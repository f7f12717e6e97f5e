"""Many tenants, each with a change every minute: does the profile processor keep up, and with how many runs?

    .venv/bin/python benchmarks/profile_tenants.py [--tenants 1000] [--rounds 3] [--baseline-tenants 20]
    smoke run: .venv/bin/python benchmarks/profile_tenants.py --tenants 30 --rounds 1 --baseline-tenants 4

A round stands for one minute of traffic: one CDC change per tenant (a new or changed profile, a link now and
then) produced to the broker, staged by the dumper (one batch: plan_next_batch -> stage_cdc_batch), then the
processor as the daemon runs it: `profile_processor_sensor` ticks on a real Dagster instance (SQLite, temporary
DAGSTER_HOME), and every run it requests is executed, one after another, as the `profile_processor_job` (merge
under the tenant locks on the real ZooKeeper, then the tenants' segments, checks and materializations). A warm-up
round first creates every tenant's raw table (not measured).

Per measured round: runs requested, the processor's wall time (the tick and its runs), CPU seconds of this process,
the Spark Connect server and ZooKeeper over the round, and each tenant's lag (from the round's produce to the end
of the run that merged it). Keeping up: the processor's wall time per round under the minute the round stands for;
cores busy: its CPU seconds over 60.

Then each profile sensor's tick with nothing to do, over all the tenants (CPU ms of this process, median of 3).

Baseline, in the same run: a round of changes for `--baseline-tenants` tenants processed with
EP_PROFILE_TENANTS_PER_RUN=1 (a run per tenant, what the processor did before runs of many tenants), its CPU per
tenant scaled to all tenants. Runs execute in this process, so the figures leave out each run's own process
(the run pool's fork: control_plane measures it, about 0.2 CPU-s a run) in both modes; the grouped mode has a
hundredth of the runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _stack import bench_stack, machine  # noqa: E402
from record import at_defaults, invocation, record_result  # noqa: E402

from engagement_platform.lake.checkpoints import CheckpointStore  # noqa: E402
from engagement_platform.lake.delta import DeltaLake  # noqa: E402
from engagement_platform.profiles.staging.apply import STREAM, stage_cdc_batch  # noqa: E402
from engagement_platform.streams.kafka import KafkaClient  # noqa: E402
from engagement_platform.streams.planning import plan_next_batch  # noqa: E402

TOPIC = "profile.cdc.tenants"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CADENCE_S = 60.0  # a round stands for a minute of traffic
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}  # the runs' events still go to the instance


def tenant(i: int) -> str:
    return f"tenant{i:04d}"


def changes(tenants: list[str], round_no: int) -> list[tuple[bytes, bytes]]:
    """One change per tenant: every fifth round a new profile linked to the first one, else the first profile's
    fields changed."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = []
    for t in tenants:
        pid = f"p{round_no}" if round_no % 5 == 4 else "p0"
        record = {
            "tenant": t,
            "primary_id": pid,
            "record_type": "person",
            "op": "upsert",
            "cdc_seq": round_no + 1,
            "cdc_ts": now,
            "fields": {"email": f"{pid}.{round_no}@{t}.example", "country": "DE", "score": round_no},
        }
        if pid != "p0":
            record["related_ids"] = ["p0"]
        out.append((f"{t}/{pid}".encode(), orjson.dumps(record)))
    return out


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / CLOCK_TICKS


def server_pids(state: Path) -> dict[str, int]:
    pids = {}
    for name in ("spark", "zookeeper"):
        path = state / "pids" / f"{name}.pid"
        if path.exists():
            pids[name] = int(path.read_text().split()[0])
    return pids


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Platform:
    """The lake, the broker and a Dagster instance with the processor's job and sensor, as the daemon has them."""

    def __init__(self, env: dict, dagster_home: Path):
        from dagster import DagsterInstance, Definitions

        from engagement_platform.profiles.processor.assets import profile_processor_job, profile_raw
        from engagement_platform.profiles.segments.assets import profile_segments
        from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource

        lake = LakeResource(root=env["EP_LAKE_ROOT"])
        self.resources = {
            "kafka": KafkaResource(bootstrap_servers=env["KAFKA_BOOTSTRAP_SERVERS"]),
            "lake": lake,
            "coordinator": CoordinatorResource(lake=lake),
            "spark": SparkResource(spark_config={"spark.remote": env["SPARK_REMOTE"]}),
        }
        self.instance = DagsterInstance.local_temp(str(dagster_home))
        self.job = Definitions(
            assets=[profile_raw, profile_segments], jobs=[profile_processor_job], resources=self.resources
        ).resolve_job_def(profile_processor_job.name)
        self.lake = DeltaLake(env["EP_LAKE_ROOT"])
        self.store = CheckpointStore(self.lake)
        self.bootstrap = env["KAFKA_BOOTSTRAP_SERVERS"]
        self.kafka = KafkaClient(self.bootstrap)

    def stage(self, spark) -> int:
        """Stage everything produced (one dumper batch per slice)."""
        marks = self.kafka.watermarks(TOPIC)
        staged = 0
        while (plan := plan_next_batch(STREAM, TOPIC, self.store.latest_plan(STREAM), marks, 1_000_000)) is not None:
            self.store.record_plan(plan)
            staged += stage_cdc_batch(spark, self.lake, self.store, self.bootstrap, plan).rows_staged
        return staged

    def process(self, started: float) -> tuple[int, dict[str, float]]:
        """The processor sensor's tick and every run it requests, one after another: (runs, tenant -> its lag)."""
        from dagster import build_sensor_context

        from engagement_platform.profiles.assets import profile_tenants, run_tenants
        from engagement_platform.profiles.processor.sensors import profile_processor_sensor

        with build_sensor_context(instance=self.instance, resources=self.resources) as context:
            result = profile_processor_sensor(context)
        for add in getattr(result, "dynamic_partitions_requests", None) or []:
            self.instance.add_dynamic_partitions(profile_tenants.name, list(add.partition_keys))
        keys = self.instance.get_dynamic_partitions(profile_tenants.name)
        lags: dict[str, float] = {}
        requests = getattr(result, "run_requests", None) or []
        for request in requests:
            ran = self.job.execute_in_process(
                instance=self.instance, tags=request.tags, partition_key=request.partition_key, run_config=QUIET
            )
            assert ran.success, request
            done = time.perf_counter() - started
            lags.update({t: done for t in run_tenants(request.tags, keys) or [request.partition_key]})
        return len(requests), lags


def idle_ticks(platform: Platform, ticks: int = 3) -> dict[str, float]:
    """Each profile sensor's tick with nothing to do (every tenant merged and evaluated): median CPU ms of this
    process over `ticks` ticks after a first one."""
    from dagster import build_sensor_context

    from engagement_platform.profiles.processor.sensors import profile_lag_sensor, profile_processor_sensor
    from engagement_platform.profiles.segments.assets import profile_segments_sensor
    from engagement_platform.profiles.segments.upkeep.assets import profile_segments_compaction_sensor

    out = {}
    for sensor in (
        profile_processor_sensor,
        profile_lag_sensor,
        profile_segments_sensor,
        profile_segments_compaction_sensor,
    ):
        cursor, spent = None, []
        for _ in range(ticks + 1):
            before = own_cpu()
            with build_sensor_context(instance=platform.instance, resources=platform.resources, cursor=cursor) as ctx:
                result = sensor(ctx)
            spent.append(own_cpu() - before)
            cursor = getattr(result, "cursor", None) or cursor
            requested = getattr(result, "run_requests", None) or []
            assert not requested, f"{sensor.name} found work on an idle lake: {requested[:3]}"
        out[sensor.name] = round(1000 * statistics.median(spent[1:]), 1)
    return out


def round_of(platform: Platform, spark, tenants: list[str], round_no: int, pids: dict[str, int]) -> dict:
    platform.kafka.produce(TOPIC, changes(tenants, round_no))
    produced = time.perf_counter()
    staged = platform.stage(spark)
    cpu0 = {"processor_process": own_cpu(), **{n: proc_cpu(p) for n, p in pids.items()}}
    t0 = time.perf_counter()
    runs, lags = platform.process(produced)
    wall = time.perf_counter() - t0
    cpu = {"processor_process": own_cpu(), **{n: proc_cpu(p) for n, p in pids.items()}}
    spent = {n: cpu[n] - cpu0[n] for n in cpu}
    assert sorted(lags) == sorted(tenants), "every tenant merged in the round"
    return {"staged": staged, "runs": runs, "wall_s": wall, "cpu": spent, "lags": sorted(lags.values())}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-tenants", type=int, default=20)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    tenants = [tenant(i) for i in range(args.tenants)]
    with ExitStack() as stack:
        env = stack.enter_context(bench_stack("profile-tenants", servers=("zookeeper", "kafka", "spark")))
        os.environ["EP_PROFILE_CDC_TOPIC"] = TOPIC
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dagster-home-")))
        platform = Platform(env, home)
        platform.kafka.create_topics({TOPIC: 4})
        from engagement_platform.spark.session import build_session

        spark = build_session({"spark.remote": env["SPARK_REMOTE"]})
        pids = server_pids(Path(env["EP_STATE_DIR"]))

        t0 = time.perf_counter()
        warm = round_of(platform, spark, tenants, 0, pids)
        print(f"warm-up (every raw table created): {warm['runs']} runs, {time.perf_counter() - t0:.1f} s", flush=True)

        measured = []
        for n in range(1, args.rounds + 1):
            r = round_of(platform, spark, tenants, n, pids)
            measured.append(r)
            cpu = sum(r["cpu"].values())
            print(
                f"round {n}: {r['staged']} staged, {r['runs']} runs, processor {r['wall_s']:.1f} s wall, "
                f"{cpu:.1f} CPU-s ({', '.join(f'{k} {v:.1f}' for k, v in r['cpu'].items())}), "
                f"lag p50 {percentile(r['lags'], 0.5):.1f} s p99 {percentile(r['lags'], 0.99):.1f} s",
                flush=True,
            )

        ticks = idle_ticks(platform)
        print(f"idle sensor ticks, CPU ms (median of 3): {ticks}", flush=True)

        os.environ["EP_PROFILE_TENANTS_PER_RUN"] = "1"
        few = tenants[: args.baseline_tenants]
        base = round_of(platform, spark, few, args.rounds + 1, pids)
        del os.environ["EP_PROFILE_TENANTS_PER_RUN"]
        base_cpu = sum(base["cpu"].values())
        print(
            f"baseline (a run per tenant, {len(few)} tenants): {base['runs']} runs, {base['wall_s']:.1f} s wall, "
            f"{base_cpu:.1f} CPU-s = {base_cpu / len(few):.3f} CPU-s per tenant",
            flush=True,
        )

    wall = statistics.median(r["wall_s"] for r in measured)
    cpu = statistics.median(sum(r["cpu"].values()) for r in measured)
    lags = [lag for r in measured for lag in r["lags"]]
    per_tenant = cpu / args.tenants
    base_per_tenant = base_cpu / len(few)
    result = {
        "tenants": args.tenants,
        "runs per minute": statistics.median(r["runs"] for r in measured),
        "processor wall s per minute": round(wall, 1),
        "processor cpu s per minute": round(cpu, 1),
        "cores busy": round(cpu / CADENCE_S, 2),
        "tenant lag p50 s": round(percentile(lags, 0.5), 1),
        "tenant lag p99 s": round(percentile(lags, 0.99), 1),
        "cpu s per tenant": round(per_tenant, 4),
        "baseline cpu s per tenant": round(base_per_tenant, 4),
        "cpu ratio baseline over grouped": round(base_per_tenant / per_tenant, 1),
        "baseline runs per minute, scaled": args.tenants,
        "baseline cores busy, scaled": round(base_per_tenant * args.tenants / CADENCE_S, 2),
        **{f"idle tick cpu ms {name}": ms for name, ms in ticks.items()},
    }
    for k, v in result.items():
        print(f"{k}: {v}")
    record_result(
        "profile_tenants",
        invocation(),
        f"{args.tenants} tenants, a change each per round (a minute); {args.rounds} measured rounds after a warm-up "
        f"that creates the raw tables; runs executed one after another in this process on a SQLite instance; "
        f"ZooKeeper tenant locks; segments of segments/all evaluated in each run",
        result,
        target={"processor wall s per minute": "<= 60", "runs per minute": "<= 50", "tenant lag p99 s": "<= 60"}
        if at_defaults(parser, args)
        else None,  # the bounds are for 1,000 tenants
        baseline={
            "mode": f"a run per tenant ({len(few)} tenants, EP_PROFILE_TENANTS_PER_RUN=1), scaled",
            "cpu s per tenant": round(base_per_tenant, 4),
            "runs per minute": args.tenants,
        },
        load_before=load_before,
        note=f"{machine()}; CPU: this process, the Spark Connect server and ZooKeeper over the round",
    )


if __name__ == "__main__":
    main()
