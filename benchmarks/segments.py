"""Profile segments: many segments over every merged profile in one pass, full and incremental.

    .venv/bin/python benchmarks/segments.py [--tenants 50] [--profiles 20000] [--segments 1000] [--baseline-segments 10]
    smoke run: .venv/bin/python benchmarks/segments.py --tenants 4 --profiles 2000 --segments 50 --baseline-segments 3

Input (seed fixed): `--tenants` raw tables of `--profiles` profile rows each (one row per primary id, as the
processor leaves them), grouped into identities of 1-5 linked ids (component_id), with a record type
(person, trial, cart_add, purchase, page_view, signup, ticket), a cdc_ts in the last 60 days (unique per
identity), promoted country / email, and a JSON payload (product, plan, amount, cart.product, cart.qty,
device.os, score, newsletter, tags). `--segments` segment definitions from ten templates (the talk's
"trialled X in the last 7 days, added Y to the cart, has not purchased", counts and windows, min / max
over payload paths, identity facts, newest profile values, and / or / not), each parsed by the same code as
a segment file.

Full run: one evaluation batch per tenant, all tenants' batches in one Spark job (`evaluate_tenants`: a
task per tenant evaluates every segment in one pass and writes its entries and exits to the log), then one
commit. Then a compaction folds the log into the base (`compact_tenants`). Incremental run: 1% of each
tenant's identities get a changed payload and cdc_ts (a delta-rs MERGE into the raw tables, as a processor
batch would), then the next batches. Timing covers planning, the Spark job and the commits. Then
`--more-incremental` more such rounds, and a compaction of the log they left (against the full run: a
compaction must not cost more than evaluating everything again). Reads: the current members of single
segments (`segment_members`, base merged with the log), each from a fresh MembershipFiles in this warm process.

Baseline in the same run: `--baseline-segments` of the segments, each evaluated as its own Spark SQL query
(JSON through parse_json / variant_get, one GROUP BY per segment) over all tenants' raw rows, scaled to
all segments; its membership must equal the platform's for those segments.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stack import bench_stack, machine  # noqa: E402
from record import at_defaults, invocation, record_result  # noqa: E402
from segments_sql import segment_query  # noqa: E402

from engagement_platform.lake.checkpoints import CheckpointStore  # noqa: E402
from engagement_platform.lake.delta import BatchTxn, DeltaLake  # noqa: E402
from engagement_platform.profiles.segments.apply import evaluate_tenants, plan_evaluations, segments_app_id  # noqa: E402
from engagement_platform.profiles.segments.compaction import compact_tenants  # noqa: E402
from engagement_platform.profiles.segments.definitions import parse_segment  # noqa: E402
from engagement_platform.profiles.segments.membership_files import MembershipFiles  # noqa: E402
from engagement_platform.profiles.segments.read import segment_members  # noqa: E402
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES  # noqa: E402
from engagement_platform.profiles.segments.task import PHASES  # noqa: E402
from engagement_platform.profiles.tables import RAW_SCHEMA, raw_table_name, raw_table_spec  # noqa: E402
from engagement_platform.spark.session import build_session  # noqa: E402
from engagement_platform.streams.pin import AS_OF  # noqa: E402

TYPES = ["person", "trial", "cart_add", "purchase", "page_view", "signup", "ticket"]
TYPE_WEIGHTS = [30, 10, 15, 8, 25, 7, 5]
PRODUCTS = [f"prod_{i:02d}" for i in range(50)]
PLANS = ["free", "pro", "team", "enterprise"]
COUNTRIES = ["DE", "FR", "US", "IT", "ES", "NL", "PL", "SE", "JP", "BR"]
OSES = ["ios", "android", "windows", "macos", "linux"]
WINDOWS = ["1d", "7d", "30d"]
TARGET = {
    "full_s": "<= 60",
    "incremental_of_full_share": "<= 0.1",
    "ratio_to_baseline": ">= 20",
    "compaction_of_full_share": "<= 1.0",
    "segment_read_median_ms": "<= 200",
}


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def tenant(i: int) -> str:
    return f"tenant-{i:03d}"


def payload(rng: random.Random, record_type: str) -> dict:
    out: dict = {"product": rng.choice(PRODUCTS), "score": rng.randrange(100), "device": {"os": rng.choice(OSES)}}
    if record_type in ("person", "signup"):
        out |= {
            "plan": rng.choice(PLANS),
            "newsletter": rng.random() < 0.4,
            "tags": rng.sample(["a", "b", "c", "d"], rng.randint(0, 2)),
        }
    if record_type == "cart_add":
        out["cart"] = {"product": rng.choice(PRODUCTS), "qty": rng.randint(1, 5)}
    if record_type == "purchase":
        out["amount"] = round(rng.uniform(5, 500), 2)
    return out


def raw_rows(t: str, profiles: int, now: datetime, seed: int) -> pa.Table:
    rng = random.Random(f"{seed}/{t}")
    rows, k = [], 0
    while k < profiles:
        size = min(rng.choice([1, 1, 2, 3, 4, 5]), profiles - k)
        ids = [f"{t[-3:]}p{k + j:07d}" for j in range(size)]
        offsets = rng.sample(range(60 * 86400), size)  # unique cdc_ts within the identity
        for pid, offset in zip(ids, offsets):
            record_type = rng.choices(TYPES, TYPE_WEIGHTS)[0]
            ts = now - timedelta(seconds=offset, microseconds=rng.randrange(1_000_000))
            rows.append(
                {
                    "tenant": t,
                    "primary_id": pid,
                    "record_type": record_type,
                    "linked_ids": [i for i in ids if i != pid][:1],
                    "related_ids": ids,
                    "component_id": ids[0],
                    "cdc_seq": k + 1,
                    "cdc_ts": ts,
                    "deleted": False,
                    "fields": orjson.dumps(payload(rng, record_type)).decode(),
                    "email": f"{pid}@{t}.example" if rng.random() < 0.8 else None,
                    "country": rng.choice(COUNTRIES) if rng.random() < 0.9 else None,
                    "updated_at": ts,
                    "batch_id": 0,
                    "processed_at": now,
                }
            )
            k += 1
    return pa.Table.from_pylist(rows, schema=RAW_SCHEMA)


def segment_definitions(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)

    def cmp(path, op, value=None):
        return {"path": path, "op": op, **({} if value is None else {"value": value})}

    templates = [
        lambda: {
            "all": [
                {
                    "exists": {
                        "where": {
                            "all": [cmp("record_type", "=", "trial"), cmp("fields.product", "=", rng.choice(PRODUCTS))]
                        },
                        "within": "7d",
                    }
                },
                {"exists": {"where": cmp("fields.cart.product", "=", rng.choice(PRODUCTS))}},
                {"not": {"exists": {"where": cmp("record_type", "=", "purchase")}}},
            ]
        },
        lambda: {
            "all": [
                {"profile": cmp("country", "=", rng.choice(COUNTRIES))},
                {"exists": {"where": cmp("record_type", "=", rng.choice(TYPES)), "within": rng.choice(WINDOWS)}},
            ]
        },
        lambda: {
            "count": {
                "where": cmp("record_type", "=", "page_view"),
                "within": rng.choice(WINDOWS),
                "op": ">=",
                "value": rng.randint(1, 3),
            }
        },
        lambda: {
            "max": {
                "where": cmp("record_type", "=", "purchase"),
                "path": "fields.amount",
                "within": rng.choice(["7d", "30d"]),
                "op": ">",
                "value": rng.choice([50, 100.5, 250, 400]),
            }
        },
        lambda: {"all": [{"ids": {"op": ">=", "value": rng.randint(2, 4)}}, {"has_type": rng.choice(TYPES)}]},
        lambda: {
            "all": [
                {"profile": cmp("fields.plan", "=", rng.choice(PLANS))},
                {"not": {"exists": {"where": cmp("record_type", "=", "purchase"), "within": rng.choice(WINDOWS)}}},
            ]
        },
        lambda: {"min": {"path": "fields.score", "op": "<", "value": rng.randint(1, 30)}},
        lambda: {
            "any": [
                {"profile": cmp("country", "in", rng.sample(COUNTRIES, 2))},
                {"exists": {"where": cmp("fields.device.os", "=", rng.choice(OSES)), "within": "1d"}},
            ]
        },
        lambda: {
            "all": [
                {
                    "exists": {
                        "where": {
                            "any": [
                                cmp("fields.product", "in", rng.sample(PRODUCTS, 3)),
                                cmp("fields.cart.product", "=", rng.choice(PRODUCTS)),
                            ]
                        }
                    }
                },
                {"profile": cmp("fields.newsletter", "=", True)},
                {"not": {"profile": cmp("email", "exists")}},
            ]
        },
        lambda: {
            "count": {
                "where": {
                    "all": [cmp("record_type", "=", "cart_add"), cmp("fields.cart.qty", ">=", rng.randint(2, 5))]
                },
                "op": ">=",
                "value": 1,
            }
        },
    ]
    return [
        {"name": f"seg_{i:04d}", "description": f"benchmark segment {i}", "where": templates[i % len(templates)]()}
        for i in range(count)
    ]


def build_lake(root: Path, tenants: int, profiles: int, now: datetime, seed: int) -> int:
    shutil.rmtree(root, ignore_errors=True)
    lake = DeltaLake(str(root))
    identities = 0
    for i in range(tenants):
        rows = raw_rows(tenant(i), profiles, now, seed)
        identities += len(pc.unique(rows["component_id"]))
        lake.append(raw_table_spec(tenant(i)), rows, BatchTxn("bench.backfill", 1))
    return identities


def change_one_percent(lake: DeltaLake, tenants: int, seed: int, now: datetime) -> int:
    """1% of each tenant's identities: their newest record gets a new payload and cdc_ts (a MERGE, as a processor batch)."""
    rng, changed = random.Random(seed + 1), 0
    for i in range(tenants):
        t = tenant(i)
        rows = lake.read(raw_table_name(t))
        components = sorted(set(rows["component_id"].to_pylist()))
        picked = set(rng.sample(components, max(1, len(components) // 100)))
        chosen = rows.filter(pc.is_in(rows["component_id"], value_set=pa.array(sorted(picked))))
        seen, updates = set(), []
        for r in chosen.to_pylist():
            if r["component_id"] in seen:
                continue
            seen.add(r["component_id"])
            updates.append(
                {
                    **r,
                    "cdc_seq": r["cdc_seq"] + 10_000_000,
                    "cdc_ts": now,
                    "updated_at": now,
                    "batch_id": 1,
                    "fields": orjson.dumps(payload(rng, r["record_type"])).decode(),
                }
            )
        lake.merge(
            raw_table_spec(t),
            pa.Table.from_pylist(updates, schema=RAW_SCHEMA),
            "t.primary_id = s.primary_id",
            BatchTxn("bench.change", 1),
        ).when_matched_update_all().execute()
        changed += len(updates)
    return changed


def run_all(spark, lake, store, tenants: int, segments) -> tuple[float, list]:
    t0 = time.perf_counter()
    plans = plan_evaluations(lake, store, [tenant(i) for i in range(tenants)])
    batches = [(t, plan, segments) for t, plan in plans.items()]
    results = evaluate_tenants(spark, lake, store, batches)
    return time.perf_counter() - t0, results


def with_tenant(members: pa.Table, name: str) -> pa.Table:
    return members.append_column("tenant", pa.array([name] * members.num_rows, pa.string()))


def task_phases(results) -> str:
    return ", ".join(f"{p} {sum(r.seconds.get(f'task_{p}', 0) for r in results):.1f} s" for p in PHASES)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--profiles", type=int, default=20_000, help="profile rows per tenant")
    parser.add_argument("--segments", type=int, default=1000)
    parser.add_argument("--baseline-segments", type=int, default=10)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--more-incremental", type=int, default=9, help="incremental rounds after the measured one")
    parser.add_argument("--reads", type=int, default=20, help="single-segment reads timed")
    args = parser.parse_args()
    if args.reads < 1:
        parser.error("--reads: at least one read (the median and the maximum are reported)")

    definitions = segment_definitions(args.segments, args.seed)
    segments = [parse_segment(d, f"bench/{d['name']}.yaml") for d in definitions]
    assert all(s is not None and not problems for s, problems in segments), [p for _, p in segments if p]
    segments = [s for s, _ in segments]

    with bench_stack("segments", servers=("spark",)) as env:
        root = Path(env["EP_LAKE_ROOT"])
        now = datetime.now(UTC)
        t = time.perf_counter()
        identities = build_lake(root, args.tenants, args.profiles, now, args.seed)
        build_s = time.perf_counter() - t
        lake = DeltaLake(str(root))
        store = CheckpointStore(lake)
        spark = build_session({"spark.remote": env["SPARK_REMOTE"]}, shared=False)
        spark.range(1).count()
        try:
            load_full = [loadavg()]
            full_s, full = run_all(spark, lake, store, args.tenants, segments)
            load_full.append(loadavg())
            t = time.perf_counter()
            first_compaction = compact_tenants(spark, lake, [tenant(i) for i in range(args.tenants)])
            first_compaction_s = time.perf_counter() - t
            changed = change_one_percent(lake, args.tenants, args.seed, datetime.now(UTC))
            load_inc = [loadavg()]
            inc_s, inc = run_all(spark, lake, store, args.tenants, segments)
            load_inc.append(loadavg())
            more_s = []
            for round_ in range(args.more_incremental):
                change_one_percent(lake, args.tenants, args.seed + 100 + round_, datetime.now(UTC))
                more_s.append(run_all(spark, lake, store, args.tenants, segments)[0])
            load_compaction = [loadavg()]
            t = time.perf_counter()
            compaction = compact_tenants(spark, lake, [tenant(i) for i in range(args.tenants)])
            compaction_s = time.perf_counter() - t
            load_compaction.append(loadavg())
            # a reader's view: the current members of one segment of one tenant, base merged with the log
            # (one more incremental round first, so that the log holds rows after the compaction point)
            change_one_percent(lake, args.tenants, args.seed + 999, datetime.now(UTC))
            last = run_all(spark, lake, store, args.tenants, segments)[1]
            read_rng, read_ms, read_rows = random.Random(args.seed + 5), [], []
            for _ in range(args.reads):
                t = time.perf_counter()
                got = segment_members(
                    lake,
                    tenant(read_rng.randrange(args.tenants)),
                    read_rng.choice(segments).name,
                    files=MembershipFiles(lake),
                )
                read_ms.append((time.perf_counter() - t) * 1000)
                read_rows.append(got.num_rows)
            read_ms.sort()

            sample = random.Random(args.seed).sample(segments, min(args.baseline_segments, len(segments)))
            files = [f for i in range(args.tenants) for f in lake.table(raw_table_name(tenant(i))).file_uris()]
            evaluated_at = {  # the newest evaluation, which the members read below reflect
                r.tenant: datetime.fromisoformat(
                    lake.batch_commit(PROFILE_SEGMENT_CHANGES.name, segments_app_id(r.tenant), r.plan.batch_id)[AS_OF]
                )
                for r in last
            }
            shared = MembershipFiles(lake)
            committed = pa.concat_tables(
                [
                    with_tenant(segment_members(lake, tenant(i), [s.name for s in sample], files=shared), tenant(i))
                    for i in range(args.tenants)
                ]
            )
            load_base = [loadavg()]
            t = time.perf_counter()
            mismatches = []
            raw = spark.read.parquet(*files)
            times = spark.createDataFrame(
                [(t, at.timestamp()) for t, at in evaluated_at.items()], "tenant string, now_s double"
            )
            for s in sample:
                got = {(r["tenant"], r["identity"]) for r in segment_query(raw, times, s).collect()}
                expected = set(
                    zip(
                        *(
                            committed.filter(pc.equal(committed["segment"], s.name))[c].to_pylist()
                            for c in ("tenant", "identity")
                        )
                    )
                )
                if got != expected:
                    mismatches.append((s.name, len(got), len(expected), len(got ^ expected)))
            base_s = time.perf_counter() - t
            load_base.append(loadavg())
        finally:
            spark.stop()

    scaled = base_s / max(len(sample), 1) * len(segments)
    members = sum(r.members for r in full)
    print(f"machine: {machine()}")
    print(
        f"input: {args.tenants} tenants x {args.profiles:,} profiles = {args.tenants * args.profiles:,} rows, {identities:,} identities; "
        f"{len(segments)} segments; built in {build_s:.1f} s"
    )
    print(
        f"full (load {load_full[0]} -> {load_full[1]}): {full_s:.2f} s; {members:,} memberships; "
        f"{len(segments) * identities / full_s:,.0f} identity-segment evaluations/s; "
        f"prepare {full[0].seconds.get('prepare', 0):.2f} s, Spark job {full[0].seconds.get('evaluate', 0):.2f} s"
        f", commits {full[0].seconds.get('commit', 0):.2f} s; task time summed: {task_phases(full)}; "
        f"{members / identities / len(segments):.1%} of identities per segment on average"
    )
    print(
        f"incremental after {changed:,} identities changed ({changed / identities:.1%}) (load {load_inc[0]} -> {load_inc[1]}): "
        f"{inc_s:.2f} s = {inc_s / full_s:.1%} of full; modes {sorted({r.mode for r in inc})}; identities evaluated "
        f"{sum(r.identities_evaluated for r in inc):,}; entered {sum(r.entered for r in inc):,}, exited {sum(r.exited for r in inc):,}; "
        f"prepare {inc[0].seconds.get('prepare', 0):.2f} s, Spark job {inc[0].seconds.get('evaluate', 0):.2f} s, commits {inc[0].seconds.get('commit', 0):.2f} s; "
        f"task time summed: {task_phases(inc)}"
    )
    folded = sum(c.log_rows for c in compaction)
    print(
        f"compaction after the full run: {first_compaction_s:.2f} s ({sum(c.log_rows for c in first_compaction):,} log rows "
        f"folded); after {1 + len(more_s)} incremental runs (the others {', '.join(f'{x:.2f}' for x in more_s)} s) "
        f"(load {load_compaction[0]} -> {load_compaction[1]}): {compaction_s:.2f} s = {compaction_s / full_s:.1%} of full, "
        f"{folded:,} log rows folded into {sum(c.base_rows for c in compaction):,} base rows -> "
        f"{sum(c.members for c in compaction):,}; seconds {compaction[0].seconds if compaction else {}}"
    )
    print(
        f"current members of one segment (base merged with one run's log, {args.reads} reads): median "
        f"{read_ms[len(read_ms) // 2]:.1f} ms, max {read_ms[-1]:.1f} ms; {sum(read_rows) / len(read_rows):,.0f} members on average"
    )
    print(
        f"baseline (load {load_base[0]} -> {load_base[1]}): {len(sample)} segments one Spark SQL query each in {base_s:.2f} s "
        f"-> {scaled:.1f} s scaled to {len(segments)}; ratio {scaled / full_s:.1f}x; membership "
        + ("identical" if not mismatches else f"DIFFERS: {mismatches}")
    )
    record_result(
        "segments",
        invocation(),
        f"{args.tenants} tenants x {args.profiles:,} profile rows, {identities:,} identities; {len(segments):,} segments; "
        f"incremental after {changed:,} identities ({changed / identities:.1%}) changed",
        {
            "full_s": round(full_s, 2),
            "incremental_s": round(inc_s, 2),
            "incremental_of_full_share": round(inc_s / full_s, 3),
            "ratio_to_baseline": round(scaled / full_s, 1),
            "memberships": members,
            "membership_equals_baseline": not mismatches,
            "compaction_after_full_s": round(first_compaction_s, 2),
            "compaction_s": round(compaction_s, 2),
            "compaction_of_full_share": round(compaction_s / full_s, 3),
            "log_rows_folded": folded,
            "segment_read_median_ms": round(read_ms[len(read_ms) // 2], 1),
            "segment_read_max_ms": round(read_ms[-1], 1),
        },
        # the bounds are for the default input: 1,000 segments over 1M profile rows
        target=TARGET if at_defaults(parser, args) else None,
        baseline={"what": f"{len(sample)} segments as one Spark SQL query each, scaled", "scaled_s": round(scaled, 1)},
        load_before=float(load_full[0].split()[0]),
    )


if __name__ == "__main__":
    main()
