"""ID mutation stream throughput: Kafka requests -> plan -> apply_mutation_batch -> one commit of rewritten files.

    .venv/bin/python benchmarks/mutation.py [--rows 10000000] [--orgs 1000] [--requests 1000000]
        [--files-per-org 4] [--per-partition 250000] [--baseline-sample 200] [--no-scaling] [--lake local|s3]
    smoke run: .venv/bin/python benchmarks/mutation.py --rows 1000000 --requests 100000
    at three times the input, in as many batches three times the size (whether the serial share holds):
        .venv/bin/python -u benchmarks/mutation.py --rows 30000000 --requests 3000000 --per-partition 750000
    (the table is built once per --rows and cached; --no-scaling skips the cluster run)

The engagement_activity table (CDF on, partitioned by org, each org's rows in `--files-per-org` files
of disjoint engagement_date ranges over two years, as upkeep's z-order leaves them) is built once and
kept under .state/bench-mutation-cache/<parameters>; every run works on a hard-linked copy. The
requests (convert, merge, delete, update; >= 20% in cascading chains: convert-then-merge, rename-then-
revert, merge chains, update-then-delete/convert; 5% date-ranged (ids without rows in the range go pending too); ~1% aimed at ids that do not exist,
so they go to the pending table) are produced to a fresh broker, then the real stream code runs: plan
-> checkpoint -> apply_mutation_batch, timed from the first read to the last commit. Baseline in the
same run: a sample of the same requests applied one at a time, each as its own delta-rs update/delete
of the table (on a second copy), scaled up to requests/s.

Executors: Spark tasks read, fold and rewrite the files; the driver plans and commits. The script
prints the driver's CPU seconds as a share of all CPU the machine spent during the run, the driver's
peak RSS, and from Spark's task metrics (spark_metrics.py) the run's task seconds, the driver's serial
seconds (no Spark job running) and the speedup Amdahl's law gives for 2, 8 and 32 executors (the model and its
limits: spark_metrics.py). Then the same requests on a fresh copy of the table with the Connect server on a
two-worker standalone cluster (scripts/stack.sh spark-master, spark-worker-1, spark-worker-2 on the bench ports;
executors in their own processes, one core each) against the run on local[2], with the same split and the tasks
each executor ran (`--no-scaling` skips it; the stack's stop at the end stops the cluster too). With `--lake s3` the
same requests also run on a copy of the table uploaded to a local S3 endpoint (moto_server, started beside
the stack), with the same Spark session: requests/s there and the ratio to the local-disk run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _stack  # noqa: E402
from _stack import (  # noqa: E402
    REPO,
    bench_stack,
    machine,
    machine_busy_seconds,
    own_cpu_seconds,
    s3_lake,
    start_cluster,
    upload_lake,
    wait_for_broker_idle,
)
from record import invocation, record_result  # noqa: E402
from spark_metrics import SparkMetrics, Split  # noqa: E402

from engagement_platform.engagement.mutation.apply import STREAM, apply_mutation_batch  # noqa: E402
from engagement_platform.engagement.tables import ACTIVITY_TYPES, ENGAGEMENT_ACTIVITY  # noqa: E402
from engagement_platform.lake.checkpoints import CheckpointStore  # noqa: E402
from engagement_platform.lake.delta import BatchTxn, DeltaLake, sql_literal  # noqa: E402
from engagement_platform.spark.session import build_session  # noqa: E402
from engagement_platform.streams.kafka import KafkaClient  # noqa: E402
from engagement_platform.streams.planning import plan_next_batch  # noqa: E402

TOPIC = "bench.engagement.mutations"
D0 = date(2024, 11, 1)
DAYS = 730
EPOCH_DAYS = (D0 - date(1970, 1, 1)).days
LEAD_SHARE = 0.5  # rows on a lead; the others are on a contact (with an account)
# the bounds the stream is held to on this 2-core machine (1M requests in 30 s); with --lake s3, the object store's
# share of local disk
TARGET = {
    "requests_per_s": ">= 33333",
    "driver_cpu_share": "<= 0.25",
    "serial_share": "<= 0.15",
    "cluster_ratio_to_local2": ">= 0.8",
}
S3_TARGET = {"s3_ratio_to_local": ">= 0.5"}


def org_name(i: int) -> str:
    return f"00D{i:06d}"


def pools(rows_per_org: int) -> dict[str, int]:
    """Ids per org: every id in [0, pool) holds at least one row (about 2 rows per lead, 1.5 per contact)."""
    lead_rows = int(rows_per_org * LEAD_SHARE)
    return {
        "lead": max(1, lead_rows // 2),
        "contact": max(1, (rows_per_org - lead_rows) * 2 // 3),
        "account": 300,
        "user": 50,
    }


def lead(k: int) -> str:
    return f"00Q{k:07d}"


def contact(k: int) -> str:
    return f"003{k:07d}"


def engagement(org: int, j: int) -> str:
    return f"E{org:05d}{j:07d}"


# ---- the data table -------------------------------------------------------------------------------


def org_rows(rng: np.random.Generator, org: int, n: int, p: dict[str, int]) -> pa.Table:
    lead_rows = int(n * LEAD_SHARE)
    days = np.sort(rng.integers(0, DAYS, n))
    is_lead = np.zeros(n, dtype=bool)
    is_lead[rng.permutation(n)[:lead_rows]] = True
    lead_k = np.full(n, -1)
    lead_k[is_lead] = rng.permutation(lead_rows) % p["lead"]
    contact_k = np.full(n, -1)
    contact_k[~is_lead] = rng.permutation(n - lead_rows) % p["contact"]
    micros = (days + EPOCH_DAYS) * 86_400_000_000 + rng.integers(0, 86_400_000_000, n)
    ids = [engagement(org, j) for j in range(n)]
    leads = [lead(k) if k >= 0 else None for k in lead_k.tolist()]
    contacts = [contact(k) if k >= 0 else None for k in contact_k.tolist()]
    accounts = [
        f"001{k:07d}" if c is not None else None for k, c in zip(rng.integers(0, p["account"], n).tolist(), contacts)
    ]
    cols = {
        "org_id": pa.array([org_name(org)] * n),
        "engagement_id": pa.array(ids),
        "engagement_date": pa.array((days + EPOCH_DAYS).astype(np.int32)).cast(pa.date32()),
        "activity_type": pa.array(np.array(ACTIVITY_TYPES)[rng.integers(0, len(ACTIVITY_TYPES), n)]),
        "lead_id": pa.array(leads, pa.string()),
        "contact_id": pa.array(contacts, pa.string()),
        "account_id": pa.array(accounts, pa.string()),
        "user_id": pa.array(np.char.add("005", rng.integers(0, p["user"], n).astype(str))),
        "subject": pa.array(np.char.add("subject ", rng.integers(0, 1000, n).astype(str))),
        "payload": pa.array(np.char.add('{"step":', np.char.add(rng.integers(1, 9, n).astype(str), "}"))),
        "event_time": pa.array(micros).cast(pa.timestamp("us", tz="UTC")),
        "source_offset": pa.array(np.arange(n, dtype=np.int64)),
        "batch_id": pa.array(np.zeros(n, dtype=np.int64)),
    }
    table = pa.table(cols)
    for f in ENGAGEMENT_ACTIVITY.schema:
        if f.name not in table.schema.names:
            table = table.append_column(f, pa.nulls(n, f.type))
    return table.select(ENGAGEMENT_ACTIVITY.schema.names).cast(ENGAGEMENT_ACTIVITY.schema)


def build_table(root: Path, rows: int, orgs: int, files_per_org: int, seed: int) -> None:
    """One append per date slice: each append writes one file per org holding that slice's dates."""
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    lake = DeltaLake(str(tmp))
    per_org = rows // orgs
    p = pools(per_org)
    rng = np.random.default_rng(seed)
    tables = [org_rows(rng, o, per_org, p) for o in range(orgs)]
    whole = pa.concat_tables(tables)
    del tables
    slice_of = (whole["engagement_date"].cast(pa.int32()).to_numpy() - EPOCH_DAYS) * files_per_org // DAYS
    for s in range(files_per_org):
        part = whole.filter(pa.array(slice_of == s))
        lake.append(ENGAGEMENT_ACTIVITY, part, BatchTxn("bench.build", s + 1))
    tmp.rename(root)


def lake_copy(cache: Path, dest: Path) -> None:
    """Hard links for the data files (delta-rs never rewrites a file in place), a real copy of the log."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(cache), str(dest)], check=True)
    log = dest / ENGAGEMENT_ACTIVITY.name / "_delta_log"
    shutil.rmtree(log)
    shutil.copytree(cache / ENGAGEMENT_ACTIVITY.name / "_delta_log", log)


# ---- the requests ---------------------------------------------------------------------------------


def org_requests(rng: random.Random, org: int, count: int, per_org: int, p: dict[str, int]) -> tuple[list[dict], int]:
    """`count` requests of one org in request_time order, and how many of them are in chains."""
    o = org_name(org)
    out: list[dict] = []
    chained = 0
    fresh = iter(range(10**7))

    def add(op: str, **fields) -> None:
        i = len(out)
        t = f"2026-11-20T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
        if rng.random() < 0.05:  # a date-ranged request: a random one-year window (ids outside it go pending)
            start = D0 + timedelta(days=rng.randrange(DAYS - 365))
            fields.update(date_from=start.isoformat(), date_to=(start + timedelta(days=364)).isoformat())
        out.append({"request_id": f"{o}-{i:07d}", "org_id": o, "request_time": t, "op": op, **fields})

    def any_lead() -> str:
        return lead(rng.randrange(p["lead"]))

    def any_contact() -> str:
        return contact(rng.randrange(p["contact"]))

    def new_contact() -> str:
        return f"003N{org:05d}{next(fresh):05d}"

    def any_engagement() -> str:
        return engagement(org, rng.randrange(per_org))

    def record() -> dict:
        day = D0 + timedelta(days=rng.randrange(DAYS))
        return {
            "subject": f"updated {rng.randrange(10**6)}",
            "contact_id": any_contact(),
            "engagement_date": day.isoformat(),
            "call_outcome": "connected",
        }

    while len(out) < count:
        before = len(out)
        k = rng.random()
        if k < 0.20:
            add("convert", from_field="lead_id", from_id=any_lead(), to_field="contact_id", to_id=new_contact())
        elif k < 0.30:
            add("merge", field="contact_id", from_ids=[any_contact(), any_contact()], to_id=any_contact())
        elif k < 0.38:
            add("delete", engagement_id=any_engagement())
        elif k < 0.42:
            add("delete", field="lead_id", id=any_lead())
        elif k < 0.52:
            add("update", engagement_id=any_engagement(), record=record())
        elif k < 0.60:  # convert, then the new contact is merged into an existing one
            c = new_contact()
            add("convert", from_field="lead_id", from_id=any_lead(), to_field="contact_id", to_id=c)
            add("merge", field="contact_id", from_ids=[c, any_contact()], to_id=any_contact())
        elif k < 0.70:  # rename then revert
            lid, c = any_lead(), new_contact()
            add("convert", from_field="lead_id", from_id=lid, to_field="contact_id", to_id=c)
            add("convert", from_field="contact_id", from_id=c, to_field="lead_id", to_id=lid)
        elif k < 0.80:  # a merge chain: a -> b -> c
            a, b, c = any_contact(), new_contact(), new_contact()
            add("merge", field="contact_id", from_ids=[a], to_id=b)
            add("merge", field="contact_id", from_ids=[b, any_contact()], to_id=c)
        elif k < 0.89:  # update, then delete (or convert the contact it now holds)
            eid, rec = any_engagement(), record()
            add("update", engagement_id=eid, record=rec)
            if rng.random() < 0.5:
                add("delete", engagement_id=eid)
            else:
                add("merge", field="contact_id", from_ids=[rec["contact_id"]], to_id=new_contact())
        elif k < 0.99:  # three-step cascade: lead -> contact -> merged -> deleted owner
            c, d = new_contact(), new_contact()
            add("convert", from_field="lead_id", from_id=any_lead(), to_field="contact_id", to_id=c)
            add("merge", field="contact_id", from_ids=[c], to_id=d)
            add("delete", field="contact_id", id=d)
        elif k < 0.995:  # targets that do not exist (yet): held back as pending
            add(
                "convert",
                from_field="lead_id",
                from_id=f"00QMISSING{rng.randrange(10**6)}",
                to_field="contact_id",
                to_id=new_contact(),
            )
        else:
            add("update", engagement_id=f"EMISSING{org:05d}{rng.randrange(10**6)}", record=record())
        if len(out) - before > 1:
            chained += len(out) - before
    return out[:count], min(chained, count)


def all_requests(orgs: int, requests: int, per_org: int, seed: int) -> tuple[list[list[dict]], int]:
    rng = random.Random(seed)
    p = pools(per_org)
    each = requests // orgs
    by_org, chained = [], 0
    for o in range(orgs):
        reqs, c = org_requests(rng, o, each + (1 if o < requests % orgs else 0), per_org, p)
        by_org.append(reqs)
        chained += c
    return by_org, chained


# ---- the baseline: one request at a time ----------------------------------------------------------


def apply_naively(lake: DeltaLake, request: dict) -> None:
    """One delta-rs update/delete per request, predicate pruned to the org partition (and date range)."""
    table = lake.table(ENGAGEMENT_ACTIVITY.name)
    where = [f"org_id = {sql_literal(request['org_id'])}"]
    if request.get("date_from"):
        where.append(f"engagement_date >= '{request['date_from']}' AND engagement_date <= '{request['date_to']}'")
    op = request["op"]
    if op == "convert":
        where.append(f"{request['from_field']} = {sql_literal(request['from_id'])}")
        updates = {request["from_field"]: "NULL", request["to_field"]: sql_literal(request["to_id"])}
        table.update(updates=updates, predicate=" AND ".join(where))
    elif op == "merge":
        where.append(f"{request['field']} IN ({', '.join(sql_literal(i) for i in request['from_ids'])})")
        table.update(updates={request["field"]: sql_literal(request["to_id"])}, predicate=" AND ".join(where))
    elif op == "delete":
        if request.get("engagement_id"):
            where.append(f"engagement_id = {sql_literal(request['engagement_id'])}")
        else:
            where.append(f"{request['field']} = {sql_literal(request['id'])}")
        table.delete(" AND ".join(where))
    else:
        where.append(f"engagement_id = {sql_literal(request['engagement_id'])}")
        record = request["record"]
        updates = {name: "NULL" for name in ("lead_id", "account_id", "user_id")}
        updates.update(
            {k: f"CAST('{v}' AS DATE)" if k == "engagement_date" else sql_literal(v) for k, v in record.items()}
        )
        table.update(updates=updates, predicate=" AND ".join(where))


# ---- one end-to-end run -------------------------------------------------------------------------------


@dataclass
class MutationRun:
    results: list
    seconds: float
    driver_cpu: float
    machine_cpu: float
    load_before: list[str]
    load_after: list[str]
    split: Split
    rss_start_mb: float = 0.0
    rss_peak_mb: float = 0.0  # the driver's resident memory, sampled every 0.1 s during the run


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class RssSampler(threading.Thread):
    """The driver's peak RSS during the run (ru_maxrss would include the request generator's peak)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.done = rss_mb(), threading.Event()

    def run(self):
        while not self.done.wait(0.1):
            self.peak = max(self.peak, rss_mb())


def apply_all(spark, env: dict, lake: DeltaLake, marks: dict, per_partition: int) -> MutationRun:
    """Every planned batch of the topic, as the sensor-launched runs do, with the driver's and the machine's CPU."""
    store = CheckpointStore(lake)
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    results = []
    sampler = RssSampler()
    start_rss = sampler.peak
    sampler.start()
    metrics = SparkMetrics(_stack.PORTS["EP_SPARK_UI_PORT"])
    before = metrics.snapshot()
    cpu0, busy0, t = own_cpu_seconds(), machine_busy_seconds(), time.perf_counter()
    while (plan := plan_next_batch(STREAM, TOPIC, store.latest_plan(STREAM), marks, per_partition)) is not None:
        store.record_plan(plan)
        results.append(apply_mutation_batch(spark, lake, store, env["KAFKA_BOOTSTRAP_SERVERS"], plan))
    seconds = time.perf_counter() - t
    driver, busy = own_cpu_seconds() - cpu0, machine_busy_seconds() - busy0
    split = metrics.split_since(before)
    sampler.done.set()
    sampler.join()
    return MutationRun(
        results,
        seconds,
        driver,
        busy,
        load_before,
        Path("/proc/loadavg").read_text().split()[:3],
        split,
        start_rss,
        sampler.peak,
    )


# ---- main -----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--orgs", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--files-per-org", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=4, help="Kafka partitions of the request topic")
    parser.add_argument("--per-partition", type=int, default=250_000, help="batch bound per Kafka partition")
    parser.add_argument("--baseline-sample", type=int, default=200)
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--no-scaling", action="store_true", help="skip the second run, on the two-worker cluster")
    parser.add_argument(
        "--lake",
        choices=["local", "s3"],
        default="local",
        help="s3: the same requests again on a copy of the table on a local S3 endpoint (moto), compared with local disk",
    )
    parser.add_argument(
        "--ports",
        help="ZooKeeper,Kafka,Spark Connect[,Spark UI] ports if another benchmark holds the default bench ports "
        "(the two-worker cluster keeps its bench ports: add --no-scaling when another benchmark runs one)",
    )
    args = parser.parse_args()
    if args.ports:
        names = ("EP_ZK_PORT", "EP_KAFKA_PORT", "EP_SPARK_CONNECT_PORT", "EP_SPARK_UI_PORT")
        _stack.PORTS.update(zip(names, args.ports.split(",")))

    per_org = args.rows // args.orgs
    cache_root = REPO / ".state" / "bench-mutation-cache"
    cache = cache_root / f"rows{args.rows}-orgs{args.orgs}-files{args.files_per_org}-seed{args.seed}"
    t = time.perf_counter()
    built = not cache.exists()
    if built:
        cache_root.mkdir(parents=True, exist_ok=True)
        build_table(cache, args.rows, args.orgs, args.files_per_org, args.seed)
    table_s = time.perf_counter() - t

    t = time.perf_counter()
    by_org, chained = all_requests(args.orgs, args.requests, per_org, args.seed)
    flat = [r for reqs in by_org for r in reqs]
    ops: dict[str, int] = {}
    for r in flat:
        ops[r["op"]] = ops.get(r["op"], 0) + 1
    messages = [(r["org_id"].encode(), json.dumps(r).encode()) for r in flat]
    sample = random.Random(args.seed).sample(flat, min(args.baseline_sample, len(flat)))
    in_requests = len(flat)
    del by_org
    generate_s = time.perf_counter() - t

    with bench_stack("mutation", servers=("kafka", "spark")) as env:
        state = Path(env["EP_STATE_DIR"])
        lake_copy(cache, state / "lake")
        lake_copy(cache, state / "baseline-lake")
        lake = DeltaLake(str(state / "lake"))
        files_total = len(lake.file_stats(ENGAGEMENT_ACTIVITY.name))

        kafka = KafkaClient(env["KAFKA_BOOTSTRAP_SERVERS"])
        kafka.create_topics({TOPIC: args.partitions})
        t = time.perf_counter()
        kafka.produce(TOPIC, messages)
        produce_s = time.perf_counter() - t
        del messages
        settle_s = wait_for_broker_idle(env["EP_STATE_DIR"])
        marks = kafka.watermarks(TOPIC)

        t = time.perf_counter()
        spark = build_session({"spark.remote": env["SPARK_REMOTE"]}, shared=False)
        spark.range(1).count()
        connect_s = time.perf_counter() - t
        del flat  # a million dicts: the run needs the memory
        os.environ["EP_MUTATIONS_TOPIC"] = TOPIC
        run = apply_all(spark, env, lake, marks, args.per_partition)
        on_s3, upload_s, endpoint_s = None, 0.0, 0.0
        if args.lake == "s3":  # the same requests on a copy of the same table on the S3 endpoint, same Spark
            with s3_lake() as (bucket, options):
                endpoint_cpu = options.pop("cpu_seconds")
                upload_s = upload_lake(cache, f"{bucket}/mutation", options)
                cpu0 = endpoint_cpu()
                on_s3 = apply_all(spark, env, DeltaLake(f"{bucket}/mutation", options), marks, args.per_partition)
                endpoint_s = endpoint_cpu() - cpu0
        spark.stop()  # before the stack stops: a client left open kept the process alive at exit
        on_cluster = None
        if not args.no_scaling:  # the same requests on a fresh copy, the tasks in executors of a two-worker cluster
            lake_copy(cache, state / "lake-cluster")
            start_cluster()
            clustered = build_session({"spark.remote": env["SPARK_REMOTE"]}, shared=False)
            clustered.range(1).count()
            executors = SparkMetrics(_stack.PORTS["EP_SPARK_UI_PORT"]).wait_for_executors(2)
            on_cluster = apply_all(clustered, env, DeltaLake(str(state / "lake-cluster")), marks, args.per_partition)
            clustered.stop()
        results, run_s = run.results, run.seconds

        baseline_lake = DeltaLake(str(state / "baseline-lake"))
        t = time.perf_counter()
        for r in sample:
            apply_naively(baseline_lake, r)
        baseline_s = time.perf_counter() - t

    total = sum(h - lo for lo, h in marks.values())
    rps = total / run_s
    naive_rps = len(sample) / baseline_s
    sum_ = lambda key: sum(getattr(r, key) for r in results)  # noqa: E731
    phases: dict[str, float] = {}
    for r in results:
        for k, v in r.seconds.items():
            phases[k] = phases.get(k, 0.0) + v
    rewritten = sum(int(r.commit_metrics.get("files_removed") or 0) for r in results)
    print(
        f"machine: {machine()}; load average before/after the run: {' '.join(run.load_before)} / {' '.join(run.load_after)}"
    )
    print(
        f"table: {args.rows:,} rows, {args.orgs} orgs, {DAYS} days, {files_total:,} files ({args.files_per_org}/org, disjoint date ranges); "
        + (f"built in {table_s:.1f} s" if built else f"reused from {cache.relative_to(REPO)}")
    )
    print(
        f"requests: {total:,} ({', '.join(f'{k} {v:,}' for k, v in sorted(ops.items()))}); "
        f"{chained:,} in chains ({chained / in_requests:.0%}); generated in {generate_s:.1f} s"
    )
    print(
        f"stack start {env['stack_start_seconds']:.1f} s; produce {produce_s:.1f} s, then {settle_s:.0f} s until the broker was idle; "
        f"Spark Connect session + first job {connect_s:.2f} s"
    )
    print(f"run: {len(results)} batch(es), {run_s:.1f} s first read -> last commit = {rps:,.0f} requests/s")
    print("phases: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()))
    print(
        f"driver CPU: {run.driver_cpu:.1f} s of {run.machine_cpu:.1f} CPU seconds the machine spent during the run "
        f"= {run.driver_cpu / run.machine_cpu:.0%}; driver RSS {run.rss_start_mb:,.0f} MB at the start, peak {run.rss_peak_mb:,.0f} MB during the run"
    )
    for r in results:
        print(
            f"  batch {r.plan.batch_id}: {r.requests_in:,} requests, read/validate {r.seconds.get('read_validate', 0):.1f} s, "
            f"executors {r.seconds.get('executors', 0):.1f} s, commits {r.seconds.get('commits', 0):.1f} s"
        )
    print(f"split on local[2]: {run.split.line()}")
    if on_cluster is not None:
        print(
            f"two-worker cluster ({executors} executors): {on_cluster.seconds:.1f} s, local[2] {run_s:.1f} s: "
            "throughput ratio "
            f"{run_s / on_cluster.seconds:.2f} (driver CPU share {on_cluster.driver_cpu / on_cluster.machine_cpu:.0%}; "
            f"load before {' '.join(on_cluster.load_before)})"
        )
        print(f"split on the cluster: {on_cluster.split.line()}")
    print(
        f"requests in {sum_('requests_in'):,}, applied {sum_('requests_applied'):,}, malformed {sum_('requests_malformed'):,}, "
        f"pending added {sum_('pending_added'):,}, quarantined {sum_('quarantined_errors'):,}"
    )
    print(
        f"actions after reduction {sum_('actions'):,}: reduction ratio {sum_('requests_applied') / max(sum_('actions'), 1):.2f}"
    )
    print(
        f"rows scanned {sum_('rows_scanned'):,}, updated {sum_('rows_updated'):,}, replaced {sum_('rows_replaced'):,}, deleted {sum_('rows_deleted'):,}"
    )
    print(
        f"files read {sum_('files_read'):,} / {files_total:,}; executors rewrote {rewritten:,} / {files_total:,} files "
        f"({rewritten / files_total:.0%}); commits: " + ", ".join(f"{r.plan.batch_id}:{r.commit_how}" for r in results)
    )
    if on_s3 is not None:
        print(
            f"lake on S3 (moto_server on 127.0.0.1; table uploaded in {upload_s:.1f} s, not timed): {on_s3.seconds:.1f} s = "
            f"{total / on_s3.seconds:,.0f} requests/s; ratio to local disk in this run: {run_s / on_s3.seconds:.2f} "
            f"(load before/after {' '.join(on_s3.load_before)} / {' '.join(on_s3.load_after)}); the S3 endpoint itself used "
            f"{endpoint_s:.1f} CPU s of the {on_s3.machine_cpu:.1f} the machine spent ({endpoint_s / on_s3.machine_cpu:.0%}), "
            f"the platform's driver {on_s3.driver_cpu:.1f} s"
        )
    print(
        f"baseline: {len(sample)} requests one at a time (one delta-rs update/delete each) in {baseline_s:.1f} s = {naive_rps:,.1f} requests/s, "
        f"scaled to {total:,}: {total / naive_rps / 3600:.1f} h"
    )
    print(f"ratio stream / one-at-a-time: {rps / naive_rps:,.0f}x")
    scaling = (
        {
            "cluster_s": round(on_cluster.seconds, 1),
            "cluster_ratio_to_local2": round(run_s / on_cluster.seconds, 2),
            **on_cluster.split.figures("cluster_"),
        }
        if on_cluster is not None
        else {}
    )
    s3 = (
        {
            "s3_s": round(on_s3.seconds, 1),
            "s3_requests_per_s": round(total / on_s3.seconds),
            "s3_ratio_to_local": round(run_s / on_s3.seconds, 2),
            "endpoint_cpu_share": round(endpoint_s / on_s3.machine_cpu, 2),
        }
        if on_s3 is not None
        else {}
    )
    record_result(
        "mutation",
        invocation(),
        f"{args.rows:,} rows, {args.orgs:,} orgs, {files_total:,} files; {total:,} requests ({chained / in_requests:.0%} "
        f"in chains) in {len(results)} batch(es)" + ("; local disk, then a local S3 endpoint" if s3 else ""),
        {
            "end_to_end_s": round(run_s, 1),
            "requests_per_s": round(rps),
            "ratio_to_baseline": round(rps / naive_rps),
            "driver_cpu_share": round(run.driver_cpu / run.machine_cpu, 2),
            "driver_peak_rss_mb": round(run.rss_peak_mb),
            **run.split.figures(),
            **scaling,
            **s3,
        },
        target=S3_TARGET if s3 else TARGET,
        baseline={"what": f"{len(sample)} requests applied one at a time", "requests_per_s": round(naive_rps, 1)},
        load_before=float(run.load_before[0]),
    )


if __name__ == "__main__":
    main()
