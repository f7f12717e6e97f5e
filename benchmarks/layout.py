"""Layout upkeep of engagement_activity: files and date overlap before/after, upkeep time, pruning.

    .venv/bin/python benchmarks/layout.py [--rows 2000000] [--orgs 200] [--appends 100] [--target-mb 1024]

Writes the table as the ingestion stream does: many small appends, each bringing every org a small
file whose engagement dates are mostly recent plus late arrivals spread over weeks, so the files of
an org overlap. Then runs `upkeep` (z-order by engagement_date per org, vacuum) and measures what
a one-week query for one org reads through delta-rs file pruning (partition + min/max stats),
before and after. A second, small target size (several files per org) shows what the z-order adds
over plain bin-packing compaction when an org spans more than one file. No servers needed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stack import REPO, machine  # noqa: E402
from record import invocation, record_result  # noqa: E402

from engagement_platform.engagement.tables import ACTIVITY_TYPES, ENGAGEMENT_ACTIVITY  # noqa: E402
from engagement_platform.lake.delta import BatchTxn, DeltaLake  # noqa: E402
from engagement_platform.lake.layout import partition_layout, upkeep  # noqa: E402

D0 = date(2026, 1, 1)
DAYS = 180
QUERY_DAYS = 7


def batch_rows(rng: np.random.Generator, batch: int, appends: int, rows: int, orgs: list[str]) -> pa.Table:
    """One ingestion batch: dates around the batch's 'today', 40% of them late by ~3 weeks on average."""
    today = int((batch + 1) * DAYS / appends)
    late = rng.random(rows) < 0.4
    lag = np.where(late, rng.exponential(21, rows), rng.integers(0, 2, rows)).astype(np.int64)
    days = np.clip(today - lag, 0, DAYS - 1)
    epoch = (D0 - date(1970, 1, 1)).days
    seq = np.arange(rows, dtype=np.int64) + batch * rows
    micros = (days + epoch) * 86_400_000_000 + rng.integers(0, 86_400_000_000, rows)
    cols = {
        "org_id": pa.array(np.array(orgs)[rng.integers(0, len(orgs), rows)]),
        "engagement_id": pa.array(np.char.add("e", seq.astype(str))),
        "engagement_date": pa.array((days + epoch).astype(np.int32)).cast(pa.date32()),
        "activity_type": pa.array(np.array(ACTIVITY_TYPES)[rng.integers(0, len(ACTIVITY_TYPES), rows)]),
        "lead_id": pa.array(np.char.add("00Q", rng.integers(0, 10**6, rows).astype(str))),
        "user_id": pa.array(np.char.add("005", rng.integers(0, 50, rows).astype(str))),
        "payload": pa.array(np.char.add('{"step":', rng.integers(1, 9, rows).astype(str))),
        "event_time": pa.array(micros).cast(pa.timestamp("us", tz="UTC")),
        "source_offset": pa.array(seq),
        "batch_id": pa.array(np.full(rows, batch, dtype=np.int64)),
    }
    table = pa.table(cols)
    for field in ENGAGEMENT_ACTIVITY.schema:
        if field.name not in table.schema.names:
            table = table.append_column(field, pa.nulls(rows, field.type))
    return table.select(ENGAGEMENT_ACTIVITY.schema.names).cast(ENGAGEMENT_ACTIVITY.schema)


def queries(rng: np.random.Generator, orgs: list[str], count: int) -> list[tuple[str, date, date]]:
    starts = rng.integers(0, DAYS - QUERY_DAYS, count)
    return [
        (orgs[i % len(orgs)], D0 + timedelta(days=int(s)), D0 + timedelta(days=int(s) + QUERY_DAYS - 1))
        for i, s in enumerate(starts)
    ]


def scan(lake: DeltaLake, qs: list[tuple[str, date, date]]) -> dict:
    """Per query: files and bytes delta-rs keeps after partition + stats pruning, rows, seconds."""
    table = lake.table(ENGAGEMENT_ACTIVITY.name)
    actions = pa.table(table.get_add_actions(flatten=True))
    root = lake.uri(ENGAGEMENT_ACTIVITY.name)
    size = dict(zip((f"{root}/{p}" for p in actions["path"].to_pylist()), actions["size_bytes"].to_pylist()))
    files = nbytes = rows = 0
    t = time.perf_counter()
    for org, lo, hi in qs:
        pruning = [("org_id", "=", org), ("engagement_date", ">=", lo), ("engagement_date", "<=", hi)]
        uris = table.file_uris(file_pruning_predicate=pruning)
        files += len(uris)
        nbytes += sum(size[u] for u in uris)
        dataset = table.to_pyarrow_dataset(file_pruning_predicate=pruning)
        expr = (pc.field("engagement_date") >= lo) & (pc.field("engagement_date") <= hi)
        rows += dataset.to_table(columns=["engagement_id"], filter=expr).num_rows
    seconds = time.perf_counter() - t
    n = len(qs)
    return {"files": files / n, "mb": nbytes / n / 2**20, "rows": rows, "ms": seconds / n * 1000}


def describe(layout: pa.Table) -> str:
    files = pc.sum(layout["files"]).as_py()
    total = pc.sum(layout["total_bytes"]).as_py()
    return (
        f"{files:,} files ({files / layout.num_rows:.1f}/org), mean {total / files / 2**10:,.1f} KiB, "
        f"overlap mean {pc.mean(layout['overlap_ratio']).as_py():.3f} max {pc.max(layout['overlap_ratio']).as_py():.3f}, "
        f"depth mean {pc.mean(layout['max_depth']).as_py():.1f} max {pc.max(layout['max_depth']).as_py()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--orgs", type=int, default=200)
    parser.add_argument("--appends", type=int, default=100)
    parser.add_argument("--target-mb", type=float, default=1024)
    parser.add_argument("--small-target-kb", type=int, default=128, help="second run: several files per org")
    parser.add_argument("--queries", type=int, default=400)
    args = parser.parse_args()

    state = REPO / ".state" / "bench-layout"
    shutil.rmtree(state, ignore_errors=True)
    lake = DeltaLake(str(state / "lake"))
    rng = np.random.default_rng(17)
    orgs = [f"00D{n:06d}" for n in range(args.orgs)]
    per_append = args.rows // args.appends

    t = time.perf_counter()
    for batch in range(args.appends):
        lake.append(
            ENGAGEMENT_ACTIVITY,
            batch_rows(rng, batch, args.appends, per_append, orgs),
            BatchTxn("bench.ingestion", batch + 1),
        )
    write_s = time.perf_counter() - t
    fragmented = state / "fragmented"
    shutil.copytree(state / "lake", fragmented)

    qs = queries(rng, orgs, args.queries)
    layout_before = partition_layout(lake, ENGAGEMENT_ACTIVITY.name)
    scan_before = scan(lake, qs)

    result = upkeep(lake, ENGAGEMENT_ACTIVITY, target_file_bytes=int(args.target_mb * 2**20), vacuum_retention_hours=0)
    scan_after = scan(lake, qs)
    again = upkeep(lake, ENGAGEMENT_ACTIVITY, target_file_bytes=int(args.target_mb * 2**20), vacuum_retention_hours=0)

    # Small target: z-order (upkeep) vs plain compaction, each on a copy of the fragmented table.
    small = args.small_target_kb * 1024
    small_runs = {}
    for kind in ("compact", "z-order"):
        root = state / f"small-{kind}"
        shutil.copytree(fragmented, root)
        copy = DeltaLake(str(root))
        t = time.perf_counter()
        if kind == "compact":
            copy.table(ENGAGEMENT_ACTIVITY.name).optimize.compact(target_size=small)
        else:
            upkeep(copy, ENGAGEMENT_ACTIVITY, target_file_bytes=small)
        small_runs[kind] = (time.perf_counter() - t, partition_layout(copy, ENGAGEMENT_ACTIVITY.name), scan(copy, qs))

    assert (
        scan_before["rows"]
        == scan_after["rows"]
        == small_runs["compact"][2]["rows"]
        == small_runs["z-order"][2]["rows"]
    )
    sec = result["seconds"]
    print(f"machine: {machine()}")
    print(
        f"input: {args.rows:,} rows, {args.orgs} orgs, {args.appends} appends of {per_append:,} rows over {DAYS} days "
        f"(40% late, ~21 days mean lag); written in {write_s:.1f} s"
    )
    print(f"before:  {describe(layout_before)}")
    print(
        f"upkeep (target {args.target_mb:g} MiB): {sec['layout'] + sec['optimize'] + sec['vacuum']:.1f} s "
        f"(layout {sec['layout']:.2f} s, z-order {len(result['partitions_compacted'])} orgs {sec['optimize']:.1f} s, "
        f"vacuum {result['files_vacuumed']:,} files {sec['vacuum']:.1f} s), conflicts {len(result['partitions_conflicted'])}, unsettled {len(result['partitions_unsettled'])}"
    )
    print(f"after:   {describe(result['layout_after'])}")
    print(
        f"second upkeep run: {len(again['partitions_compacted'])} orgs rewritten, "
        f"{sum(again['seconds'].values()):.2f} s"
    )
    print(f"query ({args.queries} x one org, {QUERY_DAYS}-day range; delta-rs partition + min/max pruning):")
    print(
        f"  before: {scan_before['files']:.1f} files ({scan_before['mb']:.2f} MiB in them), {scan_before['ms']:.1f} ms per query"
    )
    print(
        f"  after:  {scan_after['files']:.1f} files ({scan_after['mb']:.2f} MiB in them), {scan_after['ms']:.1f} ms per query"
    )
    print(
        f"  files scanned before/after: {scan_before['files'] / scan_after['files']:.1f}x, "
        f"bytes {scan_before['mb'] / scan_after['mb']:.1f}x, time {scan_before['ms'] / scan_after['ms']:.1f}x"
    )
    print(f"small target {args.small_target_kb} KiB (several files per org):")
    for kind, (seconds, layout, s) in small_runs.items():
        print(
            f"  {kind:8s} {seconds:5.1f} s -> {describe(layout)}; query reads {s['files']:.1f} files, {s['mb']:.2f} MiB, {s['ms']:.1f} ms"
        )
    for copy in ("fragmented", "small-compact", "small-z-order"):
        shutil.rmtree(state / copy)
    record_result(
        "layout",
        invocation(),
        f"{args.rows:,} rows, {args.orgs} orgs, {args.appends} appends of {per_append:,} rows over {DAYS} days "
        f"(40% late); {args.queries} one-org {QUERY_DAYS}-day queries",
        {
            "files_before": pc.sum(layout_before["files"]).as_py(),
            "files_after": pc.sum(result["layout_after"]["files"]).as_py(),
            "upkeep_s": round(sec["layout"] + sec["optimize"] + sec["vacuum"], 1),
            "files_per_query": round(scan_after["files"], 1),
            "query_ms": round(scan_after["ms"], 1),
            "fewer_files_ratio": round(scan_before["files"] / scan_after["files"], 1),
            "speedup": round(scan_before["ms"] / scan_after["ms"], 1),
        },
        baseline={
            "what": "the same queries before upkeep",
            "files_per_query": round(scan_before["files"], 1),
            "query_ms": round(scan_before["ms"], 1),
        },
    )


if __name__ == "__main__":
    main()
