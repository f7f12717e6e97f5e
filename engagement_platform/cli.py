"""Command line: topics, demo traffic, one batch outside Dagster, and reads for downstream consumers.

engagement-platform create-topics
engagement-platform demo-produce --rate 200
engagement-platform demo-landing --files 2 --rows 5000
engagement-platform changes --org 00D000001 --since -1
engagement-platform read --org 00D000001 --from 2026-01-01 --to 2026-01-31
engagement-platform run-batch --stream mutation --batch-id 3
engagement-platform run-batch --stream profile_processor/tenant01
engagement-platform run-batch --stream ingest/rewards_members --batch-id 1
engagement-platform demo-profile-cdc --rate 20 --snapshot-dir .state/exports/profiles
engagement-platform profile-backfill --tenant tenant01 --path .state/exports/profiles --until 2026-01-05T12:00:00Z
engagement-platform segment-members --tenant tenant01 --segment engaged_germans [--as-of-batch 41] [--json]
engagement-platform segment-changes --tenant tenant01 --since-batch 41 [--json]
engagement-platform segments-compact [--tenant tenant01 ...]
engagement-platform status [--json] [--stream ingestion]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import date

from engagement_platform.settings import load_settings

PARTITIONS = {
    "activities": 3,
    "mutations": 3,
    "gdpr": 1,
    "profile_cdc": 3,
    "profile_erasure": 1,
}  # per topic, when the CLI creates it


def configured_topics() -> dict[str, int]:
    """Topic name -> partitions, named as the streams read them at run time (EP_*_TOPIC overrides included)."""
    settings = load_settings()
    names = {
        "activities": settings.ingestion.topic,
        "mutations": settings.mutation.topic,
        "gdpr": settings.retention.topic,
        "profile_cdc": settings.profiles.cdc_topic,
        "profile_erasure": settings.profiles.erasure_topic,
    }
    return {names[stream]: partitions for stream, partitions in PARTITIONS.items()}


def _lake():
    from engagement_platform.lake.delta import DeltaLake

    settings = load_settings()
    return DeltaLake(settings.lake_root, settings.storage_options or None)


def _spark():
    from engagement_platform.spark.session import build_session, session_config

    settings = load_settings()
    return build_session(session_config(settings.spark_remote, settings.spark_master))


def _coordinator():
    """The ZooKeeper coordinator the platform's runs lock with (None when EP_COORDINATOR=off); the caller closes it."""
    from engagement_platform.streams.coordinator import Coordinator

    settings = load_settings()
    if not settings.coordinator_enabled:
        return None
    return Coordinator(settings.zookeeper_hosts, settings.zookeeper_root, auth=settings.zookeeper_auth)


def create_topics(args) -> None:
    from engagement_platform.streams.kafka import KafkaClient

    topics = configured_topics()
    # Topic retention is the operator's in production; a laptop demo producing for hours needs a bound.
    # Retention deletes whole log segments only, so segments roll at a fifth of it (Kafka's default rolls weekly).
    retention_ms = int(args.retention_minutes * 60_000)
    config = (
        {"retention.ms": str(retention_ms), "segment.ms": str(max(retention_ms // 5, 1000))}
        if args.retention_minutes
        else None
    )
    KafkaClient(load_settings().kafka_bootstrap_servers).create_topics(topics, config=config)
    kept = f", messages kept {args.retention_minutes:g} min" if args.retention_minutes else ""
    print("topics ready:", ", ".join(f"{t} ({n} partitions)" for t, n in topics.items()) + kept)


def demo_produce(args) -> None:
    from engagement_platform.engagement.demo_traffic import DemoTraffic, produce_demo_traffic

    traffic = DemoTraffic(
        args.rate, args.count, args.orgs, args.bad_ratio, args.seed, args.mutations_every, args.gdpr_every
    )
    produce_demo_traffic(load_settings(), traffic, args.slice_seconds)


def changes(args) -> None:
    from engagement_platform.engagement.tables import ENGAGEMENT_NOTIFICATIONS
    from engagement_platform.lake.changes import changes_since

    result = changes_since(_lake(), ENGAGEMENT_NOTIFICATIONS, args.table, args.org, args.since)
    rows = result.rows.slice(0, args.limit).to_pylist() if result.rows.num_columns else []
    json.dump(
        {
            "org_id": args.org,
            "checkpoint": result.checkpoint,
            "table_versions": result.table_versions,
            "row_count": result.rows.num_rows,
            "rows": rows,
        },
        sys.stdout,
        default=str,
        indent=1,
    )
    print()


def read(args) -> None:
    from engagement_platform.lake.changes import read_org_dates

    rows = read_org_dates(_lake(), args.table, args.org, args.start, args.end)
    for row in rows.slice(0, args.limit).to_pylist():
        print(json.dumps(row, default=str))
    print(f"{rows.num_rows} rows", file=sys.stderr)


def run_batch(args) -> None:
    """One planned batch of any stream outside Dagster (recovery, crash tests), without the coordinator lock."""
    from engagement_platform.lake.checkpoints import CheckpointStore
    from engagement_platform.registry import batch_run
    from engagement_platform.streams.by_hand import BatchRequestError
    from engagement_platform.streams.spec import BatchContext

    lake = _lake()
    checkpoints = CheckpointStore(lake)
    try:
        run = batch_run(args.stream, checkpoints, args.batch_id, args.path, args.until)
    except BatchRequestError as exc:
        sys.exit(f"run-batch: {exc}")
    result = run(BatchContext(_spark(), lake, checkpoints, load_settings().kafka_bootstrap_servers))
    if result is None:
        print(f"{args.stream}: nothing staged since its last batch", file=sys.stderr)
        return
    print(json.dumps(result.metadata(), default=str))


def demo_landing(args) -> None:
    from engagement_platform.lake.file_writes import join
    from engagement_platform.landing.demo import write_members_file

    settings = load_settings()
    folder = join(settings.landing_root, "rewards_members")
    for n in range(args.files):
        seed = args.seed + n
        path = write_members_file(
            folder,
            f"members-{seed}.csv",
            args.rows,
            seed,
            args.bad_ratio,
            first_id=seed * args.rows,
            storage_options=settings.storage_options,
        )
        print(f"landed {path} ({args.rows} rows)")


def demo_profile_cdc(args) -> None:
    from engagement_platform.profiles.demo import ProfileCdcGenerator, write_snapshot_export
    from engagement_platform.streams.kafka import KafkaClient, ReplacingProducer

    if args.snapshot_dir:
        print(f"snapshot export for the backfill: {write_snapshot_export(args.snapshot_dir)}", flush=True)
    topic = load_settings().profiles.cdc_topic
    gen = ProfileCdcGenerator(seed=args.seed, tenants=args.tenants)
    producer = ReplacingProducer(
        KafkaClient(load_settings().kafka_bootstrap_servers).producer
    )  # survives a broker that forgot it
    sent, started = 0, time.monotonic()
    print(f"producing ~{args.rate}/s profile CDC changes to {topic} (Ctrl-C stops)", flush=True)
    try:
        while args.count <= 0 or sent < args.count:
            key, value = gen.message()
            producer.produce(topic, key=key, value=value)
            sent += 1
            producer.poll(0)
            ahead = sent / args.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    except KeyboardInterrupt:
        pass
    finally:
        producer.flush(10)


def profile_backfill(args) -> None:
    """One backfill outside Dagster, under the tenant lock unless EP_COORDINATOR=off."""
    from engagement_platform.lake.checkpoints import CheckpointStore
    from engagement_platform.profiles.backfill.apply import backfill_stream, backfill_tenant
    from engagement_platform.profiles.locks import tenant_lock

    lake = _lake()
    spark = _spark()
    zk = _coordinator()
    try:
        with tenant_lock(zk, args.tenant, f"{backfill_stream(args.tenant)}/cli"):
            result = backfill_tenant(spark, lake, CheckpointStore(lake), args.tenant, args.path, args.until)
    finally:
        if zk is not None:
            zk.close()
    print(json.dumps(result.metadata(), default=str))


def _print_rows(args, document: dict, rows: list[dict], columns: list[str]) -> None:
    """`document` with the rows as JSON (--json), else the rows' `columns` as tab-separated lines under a header."""
    if args.json:
        json.dump(document, sys.stdout, default=str, indent=1)
        print()
        return
    print("\t".join(columns))
    for row in rows:
        print("\t".join(v.isoformat() if hasattr(v, "isoformat") else str(v) for v in (row[c] for c in columns)))


def segment_members(args) -> None:
    """A tenant's members, merged from the compacted base and the change log."""
    from engagement_platform.profiles.segments.read import segment_members as members_of

    rows = members_of(_lake(), args.tenant, args.segment, args.as_of_batch).to_pylist()
    document = {"tenant": args.tenant, "as_of_batch": args.as_of_batch, "member_count": len(rows), "members": rows}
    _print_rows(args, document, rows, ["segment", "identity", "entered_at"])
    print(f"{len(rows)} members", file=sys.stderr)


def segment_changes(args) -> None:
    """A tenant's entries and exits after a checkpoint, then the checkpoint to pass next."""
    from engagement_platform.profiles.segments.read import latest_batch, membership_changes

    lake = _lake()
    # the checkpoint is read first and the changes kept up to it: a batch committed in between is left to
    # the next call, not skipped by a checkpoint that already counts it
    checkpoint = max(latest_batch(lake, args.tenant), args.since_batch)
    rows = membership_changes(lake, args.tenant, args.since_batch, args.segment, up_to_batch=checkpoint).to_pylist()
    document = {"tenant": args.tenant, "since_batch": args.since_batch, "change_count": len(rows), "changes": rows}
    _print_rows(
        args,
        {**document, "checkpoint": checkpoint},
        rows,
        ["batch_id", "change", "segment", "identity", "evaluated_at"],
    )
    if not args.json:
        print(f"checkpoint {checkpoint}")


def compaction_tenants(lake) -> list[str]:
    """Every tenant with a raw table or a partition in the segment change log."""
    from engagement_platform.profiles.erasure.upkeep import raw_tenants
    from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES

    tenants = set(raw_tenants(lake))
    if lake.exists(PROFILE_SEGMENT_CHANGES.name):  # its file list has the partition column even when empty
        tenants.update(lake.file_stats(PROFILE_SEGMENT_CHANGES.name)["partition.tenant"].to_pylist())
    return sorted(t for t in tenants if t)


def segments_compact(args) -> None:
    """Fold tenants' segment change logs into the base, under their tenant locks unless EP_COORDINATOR=off."""
    from engagement_platform.profiles.segments.compaction import COMPACTION, compact_tenants

    lake = _lake()
    tenants = sorted(set(args.tenant)) if args.tenant else compaction_tenants(lake)
    if not tenants:
        print("segments-compact: no tenant has a raw table or a change log", file=sys.stderr)
        return
    spark = _spark()
    zk = _coordinator()
    try:
        compacted = compact_tenants(spark, lake, tenants, zk, owner=f"{COMPACTION}/cli")
    finally:
        if zk is not None:
            zk.close()
    for result in compacted:
        print(json.dumps(result.metadata(), default=str))
    left = sorted(set(tenants) - {r.tenant for r in compacted})
    if left:
        print(f"segments-compact: nothing logged since the last compaction of {', '.join(left)}", file=sys.stderr)


def status(args) -> None:
    """Per stream and tenant: latest batch and state, attempts, lock holder, lag, paused and how to resume."""
    from engagement_platform.status.collect import collect
    from engagement_platform.status.report import render_text, report_json

    report = collect(wanted=args.stream)
    print(json.dumps(report_json(report), indent=1) if args.json else render_text(report))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="engagement-platform")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("create-topics", help="create the platform's Kafka topics")
    p.add_argument(
        "--retention-minutes", type=float, default=0, help="topic retention.ms in minutes (0: the broker's default)"
    )
    p.set_defaults(fn=create_topics)

    p = sub.add_parser("demo-produce", help="stream realistic engagement activities")
    p.add_argument("--rate", type=int, default=200, help="messages per second")
    p.add_argument("--count", type=int, default=0, help="stop after this many (0: run until Ctrl-C)")
    p.add_argument("--orgs", type=int, default=20)
    p.add_argument("--bad-ratio", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument(
        "--mutations-every", type=int, default=50, help="one ID mutation request per this many activities (0: none)"
    )
    p.add_argument(
        "--gdpr-every", type=int, default=2000, help="one retention/erasure request per this many activities (0: none)"
    )
    p.add_argument(
        "--slice-seconds", type=float, default=0.1, help="send the messages due in each slice of this length together"
    )
    p.set_defaults(fn=demo_produce)

    p = sub.add_parser("demo-landing", help="land demo CSV files for the rewards_members ingest pipeline")
    p.add_argument("--files", type=int, default=2)
    p.add_argument("--rows", type=int, default=5000)
    p.add_argument("--bad-ratio", type=float, default=0.03)
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.set_defaults(fn=demo_landing)

    p = sub.add_parser("changes", help="rows of one org changed since a notification checkpoint")
    p.add_argument("--org", required=True)
    p.add_argument(
        "--since", type=int, default=-1, help="checkpoint returned by the previous call (-1: from the start)"
    )
    p.add_argument("--table", default="engagement_activity")
    p.add_argument("--limit", type=int, default=100, help="rows to print (the count covers all)")
    p.set_defaults(fn=changes)

    p = sub.add_parser("read", help="one org's rows in an engagement_date range")
    p.add_argument("--org", required=True)
    p.add_argument("--from", dest="start", type=date.fromisoformat)
    p.add_argument("--to", dest="end", type=date.fromisoformat)
    p.add_argument("--table", default="engagement_activity")
    p.add_argument("--limit", type=int, default=100)
    p.set_defaults(fn=read)

    p = sub.add_parser("run-batch", help="run one planned batch of any stream outside Dagster (recovery, crash tests)")
    p.add_argument(
        "--stream",
        required=True,
        help="a registered stream (registry.py): mutation, profile_processor/<tenant>, ingest/<pipeline>...; "
        "a name it does not know lists them all",
    )
    p.add_argument(
        "--batch-id",
        type=int,
        help="the planned batch (profile_processor, profile_backfill: the unfinished batch to resume)",
    )
    p.add_argument("--path", help="profile_backfill: folder of JSON lines / Parquet files, or one file")
    p.add_argument("--until", help="profile_backfill: ISO time boundary, later rows are left to CDC")
    p.set_defaults(fn=run_batch)

    p = sub.add_parser("demo-profile-cdc", help="stream demo profile CDC changes (and write a snapshot export)")
    p.add_argument("--rate", type=int, default=20, help="messages per second")
    p.add_argument("--count", type=int, default=0, help="stop after this many (0: run until Ctrl-C)")
    p.add_argument("--tenants", type=int, default=3)
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument(
        "--snapshot-dir", default="", help="first write a snapshot export of tenant01 here (for profile-backfill)"
    )
    p.set_defaults(fn=demo_profile_cdc)

    p = sub.add_parser(
        "profile-backfill", help="load a snapshot export into a tenant's raw table (under the tenant lock)"
    )
    p.add_argument("--tenant", required=True)
    p.add_argument("--path", required=True, help="folder of JSON lines / Parquet files, or one file")
    p.add_argument("--until", required=True, help="ISO time boundary: later rows are left to CDC")
    p.set_defaults(fn=profile_backfill)

    p = sub.add_parser("segment-members", help="a tenant's segment members (the compacted base merged with the log)")
    p.add_argument("--tenant", required=True)
    p.add_argument("--segment", action="append", help="only this segment (repeat for several; default: all)")
    p.add_argument("--as-of-batch", type=int, help="the members right after this evaluation batch (default: now)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of tab-separated lines")
    p.set_defaults(fn=segment_members)

    p = sub.add_parser("segment-changes", help="a tenant's segment entries and exits since a checkpoint, the next one")
    p.add_argument("--tenant", required=True)
    p.add_argument("--since-batch", type=int, required=True, help="the checkpoint the last call printed (-1: all)")
    p.add_argument("--segment", action="append", help="only this segment (repeat for several; default: all)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of tab-separated lines")
    p.set_defaults(fn=segment_changes)

    p = sub.add_parser("segments-compact", help="fold segment change logs into the membership base (tenant locks)")
    p.add_argument("--tenant", action="append", help="repeatable (default: every tenant with a raw table or a log)")
    p.set_defaults(fn=segments_compact)

    p = sub.add_parser("status", help="per stream: latest batch and state, attempts, lock, lag, paused (runbook)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    p.add_argument("--stream", help="one stream, a family (profile_processor: every tenant) or ingest/<pipeline>")
    p.set_defaults(fn=status)

    args = parser.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
