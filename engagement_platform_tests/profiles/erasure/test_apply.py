"""Profile erasure on the real broker, Spark Connect and Delta tables: an identity (the subject and the ids
linked to it) leaves the raw table, staging and the CDC quarantine, goes on the suppression list, and never
comes back through the dumper, the processor or backfill; a crash after any commit re-runs exactly once;
merged staging expires; and with an erasure window of seconds the upkeep leaves no byte under the lake root
that holds the identity's ids, while every table still reads with deltalake and DuckDB."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import materialize
from deltalake import DeltaTable

from engagement_platform.lake.delta import BatchTxn
from engagement_platform.lake.suppression import subject_hash
from engagement_platform.lake.suppression_tables import load_suppressed
from engagement_platform.profiles.backfill.apply import backfill_tenant
from engagement_platform.profiles.erasure.apply import APP_ID, STREAM, erase_profiles_batch
from engagement_platform.profiles.erasure.assets import profile_lake_upkeep
from engagement_platform.profiles.erasure.identity import identity_ids
from engagement_platform.profiles.erasure.remaining import profile_rows_naming
from engagement_platform.profiles.erasure.upkeep import expire_staging
from engagement_platform.profiles.processor.apply import process_tenant, read_profiles
from engagement_platform.profiles.segments.apply import evaluate_tenant, plan_evaluation
from engagement_platform.profiles.segments.compaction import compact_tenants
from engagement_platform.profiles.segments.definitions import parse_segment
from engagement_platform.profiles.segments.read import segment_members
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS
from engagement_platform.profiles.tables import (
    PROFILE_CDC_STAGING,
    PROFILE_ERASED_SUBJECTS,
    PROFILE_ERASURE_AUDIT,
    PROFILE_SUPPRESSED_RECORDS,
    QUARANTINE_PROFILE_CDC,
    QUARANTINE_PROFILE_ERASURE,
    raw_table_name,
)
from engagement_platform.resources import CoordinatorResource, LakeResource
from engagement_platform.settings import load_settings
from engagement_platform.streams.planning import plan_next_batch
from engagement_platform_tests.support.cdc import new_topic, record, stage, stage_and_process
from engagement_platform_tests.support.crash import finished, killed_at
from engagement_platform_tests.support.duckdb_reader import same_rows
from engagement_platform_tests.support.lake_bytes import files_holding
from engagement_platform_tests.support.snapshots import snap, write_jsonl

SUBJECT, LINKED, KEPT, ELSEWHERE = "usr-gone-0001", "usr-gone-0002", "usr-stays-003", "usr-other-004"
WINDOW_S = 4


@pytest.fixture
def cdc_topic(kafka):
    return new_topic(kafka)


@pytest.fixture
def erasure_topic(kafka):
    name = f"test.profile.erasure.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({name: 1})
    return name


def request(rid: str, tenant: str, subject: str) -> dict:
    return {"request_id": rid, "tenant": tenant, "subject_id": subject, "request_time": "2026-02-01T10:00:00Z"}


def plan_erasure(kafka, checkpoints, topic, requests: list):
    kafka.produce(topic, [(b"e", r if isinstance(r, bytes) else json.dumps(r).encode()) for r in requests])
    p = plan_next_batch(STREAM, topic, checkpoints.latest_plan(STREAM), kafka.watermarks(topic), 10_000)
    assert checkpoints.record_plan(p)
    return p


def erase(spark, kafka, lake, checkpoints, topic, requests: list):
    return erase_profiles_batch(
        spark, lake, checkpoints, kafka.bootstrap_servers, plan_erasure(kafka, checkpoints, topic, requests)
    )


def ids_of(lake, tenant) -> set[str]:
    return {r["primary_id"] for r in read_profiles(lake, tenant, include_deleted=True).to_pylist()}


def identity_world(spark, kafka, lake, checkpoints, topic) -> None:
    """SUBJECT linked to LINKED (one merged identity) and KEPT in tenant acme, ELSEWHERE in beta; a bad record
    naming SUBJECT in quarantine; a change of LINKED staged but not merged yet."""
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        topic,
        [
            record("acme", SUBJECT, 1, {"email": "gone@x.io"}, related=[LINKED]),
            record("acme", LINKED, 1, {"email": "gone2@x.io"}),
            record("acme", KEPT, 1, {"email": "kept@x.io"}),
            record("beta", ELSEWHERE, 1, {"email": "other@x.io"}),
            {**record("acme", SUBJECT, 2), "op": "rename"},  # quarantined, naming the subject
        ],
        "acme",
    )
    process_tenant(spark, lake, checkpoints, "beta")
    stage(spark, kafka, lake, checkpoints, topic, [record("acme", LINKED, 5, {"country": "DE"})])  # staged, not merged


def test_the_rule_erases_the_whole_merged_identity():
    raw = [{"primary_id": i, "related_ids": ["a", "b", "c"]} for i in "abc"] + [
        {"primary_id": i, "related_ids": ["d", "e"]} for i in "de"
    ]
    assert identity_ids("a", raw, []) == {"a", "b", "c"}
    assert identity_ids("x", raw, [{"primary_id": "x", "related_ids": ["y"]}]) == {"x", "y"}, (
        "not merged yet: its staged links"
    )
    assert identity_ids("a", raw, [{"primary_id": "x", "related_ids": ["b", "e"]}]) == set("abcdex"), (
        "a staged link joins two identities"
    )
    assert identity_ids("z", raw, []) == {"z"}, "unknown: still suppressed"


def test_an_erasure_reads_the_quarantine_files_an_earlier_erasure_rewrote(
    spark, kafka, lake, checkpoints, cdc_topic, erasure_topic
):
    """An erasure deletes one of two quarantined records of a file, and delta-rs's DELETE writes the other back
    with string_view columns, which pyarrow's is_in and the file's min/max guarantee refuse: without
    lake.delta.text_column every later erasure batch fails reading the quarantine, until the stream pauses."""
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [
            record("acme", SUBJECT, 1, {"email": "gone@x.io"}),
            record("acme", KEPT, 1, {"email": "kept@x.io"}),
            # one quarantine file whose org_id statistics (two tenants and a null) leave the filter to the rows
            {**record("acme", SUBJECT, 2), "op": "rename"},
            {**record("beta", ELSEWHERE, 2), "op": "rename"},
            b"{broken",
        ],
        "acme",
    )
    assert lake.read(QUARANTINE_PROFILE_CDC.name).num_rows == 3
    erase(spark, kafka, lake, checkpoints, erasure_topic, [request("pe1", "acme", SUBJECT)])
    kinds = {pq.read_schema(uri).field("org_id").type for uri in lake.table(QUARANTINE_PROFILE_CDC.name).file_uris()}
    assert kinds == {pa.string_view()}, "what delta-rs's DELETE writes back (the condition this test is about)"
    second = erase(spark, kafka, lake, checkpoints, erasure_topic, [request("pe2", "acme", KEPT)])
    assert (second.requests_applied, second.ids_erased) == (1, 1)
    assert lake.read(QUARANTINE_PROFILE_CDC.name).num_rows == 2 and ids_of(lake, "acme") == set()


def test_an_erased_identity_leaves_every_profile_table_and_never_comes_back(
    spark, kafka, lake, lake_root, checkpoints, cdc_topic, erasure_topic, tmp_path, monkeypatch
):
    monkeypatch.setenv("EP_ERASURE_WINDOW", f"{WINDOW_S}s")
    secret = load_settings().erasure.secret
    identity_world(spark, kafka, lake, checkpoints, cdc_topic)
    assert lake.read(QUARANTINE_PROFILE_CDC.name).num_rows == 1
    everyone = parse_segment({"name": "everyone", "where": {"ids": {"op": ">=", "value": 1}}}, "test")[0]
    evaluate_tenant(spark, lake, checkpoints, "acme", plan_evaluation(lake, checkpoints, "acme"), [everyone])
    compact_tenants(spark, lake, ["acme"])  # the membership in the base as well as in the log
    assert {r["identity"] for r in lake.read(PROFILE_SEGMENTS.name).to_pylist()} == {SUBJECT, KEPT}, (
        "the identity's component id is an id"
    )

    early = erase(
        spark, kafka, lake, checkpoints, erasure_topic, [{"request_id": "pe0", "tenant": "acme", "subject_id": SUBJECT}]
    )
    assert early.requests_quarantined == 1, "no request_time: refused, and kept raw with the id until the erasure"
    result = erase(spark, kafka, lake, checkpoints, erasure_topic, [request("pe1", "acme", SUBJECT), b"{not json"])
    assert (result.requests_read, result.requests_applied, result.requests_quarantined, result.ids_erased) == (
        2,
        1,
        1,
        2,
    )
    assert (
        result.bytes_written > 0
        and result.bytes_removed > 0
        and result.metadata()["bytes_rewritten"] == result.bytes_written
    )
    refused = json.dumps(lake.read(QUARANTINE_PROFILE_ERASURE.name).to_pylist(), default=str)
    assert SUBJECT not in refused and "{not json" in refused, (
        "the earlier refused request naming the subject went; the other stays"
    )
    assert ids_of(lake, "acme") == {KEPT} and ids_of(lake, "beta") == {ELSEWHERE}
    assert {r["identity"] for r in lake.read(PROFILE_SEGMENTS.name).to_pylist()} == {KEPT}, "it left the base"
    assert set(segment_members(lake, "acme")["identity"].to_pylist()) == {KEPT}, "and every segment"
    assert SUBJECT not in json.dumps(lake.read(PROFILE_SEGMENT_CHANGES.name).to_pylist(), default=str), (
        "and the entries log"
    )
    suppressed = load_suppressed(lake, PROFILE_ERASED_SUBJECTS, secret)
    assert suppressed.pairs() == {
        ("acme", subject_hash(secret, "acme", SUBJECT)),
        ("acme", subject_hash(secret, "acme", LINKED)),
    }
    assert profile_rows_naming(lake, suppressed) == {
        PROFILE_CDC_STAGING.name: 0,
        QUARANTINE_PROFILE_CDC.name: 0,
        raw_table_name("acme"): 0,
    }
    (audit,) = lake.read(PROFILE_ERASURE_AUDIT.name).to_pylist()
    assert audit["subject_hash"] == subject_hash(secret, "acme", SUBJECT) and audit["ids_erased"] == 2
    assert json.loads(audit["rows_removed_by_table"]) == {raw_table_name("acme"): 2, PROFILE_CDC_STAGING.name: 3}
    assert SUBJECT not in json.dumps(audit, default=str)
    history = json.dumps(lake.table(raw_table_name("acme")).history(), default=str)
    assert SUBJECT not in history and LINKED not in history, "the rewrite logs no predicate"

    # -- nothing of the identity lands again: CDC (also linking a new id to it), a bad record, backfill, a repeated request
    staged = stage(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [
            record("acme", SUBJECT, 9, {"email": "back@x.io"}),
            record("acme", LINKED, 9, op="delete"),
            record("acme", "usr-new-0005", 1, {"email": "n@x.io"}, related=[SUBJECT]),
            {**record("acme", LINKED, 2), "op": "rename"},
            record("acme", KEPT, 2, {"country": "FR"}),
        ],
    )
    assert (staged.records_read, staged.rows_staged, staged.records_suppressed) == (5, 1, 4)
    # a dumper batch that checked the list before the erasure and committed after it: the processor drops the change
    (kept,) = lake.read(PROFILE_CDC_STAGING.name, filters=[("primary_id", "=", KEPT), ("cdc_seq", "=", 2)]).to_pylist()
    raced = pa.Table.from_pylist([{**kept, "primary_id": LINKED, "cdc_seq": 30}], schema=PROFILE_CDC_STAGING.schema)
    lake.append(PROFILE_CDC_STAGING, raced, BatchTxn("test.raced_dumper", 1))
    process_tenant(spark, lake, checkpoints, "acme")
    assert ids_of(lake, "acme") == {KEPT}
    # a segment evaluation that read the raw rows before the erasure and committed after it (evaluations take no
    # tenant lock), then a compaction that folded its entry into the base: the upkeep's purge removes both
    (member,) = lake.read(PROFILE_SEGMENT_CHANGES.name, filters=[("identity", "=", KEPT)]).to_pylist()
    raced_entry = pa.Table.from_pylist(
        [{**member, "identity": SUBJECT, "batch_id": 90}], PROFILE_SEGMENT_CHANGES.schema
    )
    lake.append(PROFILE_SEGMENT_CHANGES, raced_entry, BatchTxn("test.raced_evaluation", 1))
    compact_tenants(spark, lake, ["acme"])
    assert SUBJECT in set(segment_members(lake, "acme")["identity"].to_pylist())
    export = tmp_path / "export"
    export.mkdir()
    write_jsonl(
        export / "part-0.jsonl",
        [snap(SUBJECT, 20, {"email": "x@x.io"}), snap("usr-snap-0006", 20, {"email": "s@x.io"})],
    )
    loaded = backfill_tenant(spark, lake, checkpoints, "acme", export, "2027-01-01T00:00:00Z")
    assert loaded.records_suppressed == 1 and ids_of(lake, "acme") == {KEPT, "usr-snap-0006"}
    again = erase(spark, kafka, lake, checkpoints, erasure_topic, [request("pe1", "acme", SUBJECT)])
    assert (again.requests_applied, again.requests_quarantined, again.requests_suppressed) == (0, 0, 1)
    counts: dict[str, int] = {}
    for r in lake.read(PROFILE_SUPPRESSED_RECORDS.name).to_pylist():
        stream = r["stream"].split("/")[0]
        counts[stream] = counts.get(stream, 0) + r["records"]
    assert counts == {"profile_cdc": 4, "profile_backfill": 1, STREAM: 1}
    assert profile_rows_naming(lake, suppressed)[raw_table_name("acme")] == 0

    # -- the window: after the upkeep, no byte under the lake root holds the identity's ids
    root = Path(lake_root)
    assert files_holding(root, (SUBJECT, LINKED)), "removed files and old log entries still hold them"
    # Two upkeeps half a window apart: the raced change's log entry came after the erasure's checkpoint, so it
    # leaves with the first upkeep's checkpoint once that is older than half the window (docs/design/erasure.md).
    resources = {
        "lake": LakeResource(root=lake_root),
        "coordinator": CoordinatorResource(lake=LakeResource(root=lake_root)),
    }
    for _ in range(2):
        time.sleep(WINDOW_S / 2 + 1)
        assert materialize([profile_lake_upkeep], resources=resources).success
    assert set(segment_members(lake, "acme")["identity"].to_pylist()) == {KEPT}, "the raced entry left both tables"
    assert files_holding(root, (SUBJECT, LINKED)) == []
    assert files_holding(root, (KEPT, ELSEWHERE)), "other people's data stays"
    for folder in sorted(p.parent for p in root.rglob("_delta_log")):
        rows = DeltaTable(str(folder)).to_pyarrow_table()
        columns = [f.name for f in rows.schema if not str(f.type).startswith(("list", "large_list", "struct", "map"))]
        assert same_rows(rows, str(folder), columns), folder.name


@pytest.mark.lake_stores("local", "s3")  # exactly-once on an object store too
@pytest.mark.parametrize(
    "crash_after", [PROFILE_ERASED_SUBJECTS.name, raw_table_name("acme"), PROFILE_CDC_STAGING.name]
)
def test_killed_after_a_commit_then_rerun_erases_exactly_once(
    spark, kafka, lake, lake_root, checkpoints, cdc_topic, erasure_topic, crash_after
):
    identity_world(spark, kafka, lake, checkpoints, cdc_topic)
    p = plan_erasure(kafka, checkpoints, erasure_topic, [request("pe1", "acme", SUBJECT)])
    killed_at(STREAM, lake_root, p.batch_id, crash_after)
    finished(STREAM, lake_root, p.batch_id)
    assert checkpoints.is_done(STREAM, p.batch_id)
    assert ids_of(lake, "acme") == {KEPT}
    (audit,) = lake.read(PROFILE_ERASURE_AUDIT.name).to_pylist()
    assert json.loads(audit["rows_removed_by_table"]) == {raw_table_name("acme"): 2, PROFILE_CDC_STAGING.name: 3}, (
        "counted once, re-run included"
    )
    for table in (PROFILE_ERASED_SUBJECTS.name, raw_table_name("acme"), PROFILE_CDC_STAGING.name):
        commits = [c for c in lake.table(table).history() if c.get("app_id") == APP_ID]
        assert len(commits) == 1, table
    assert lake.read(PROFILE_ERASED_SUBJECTS.name).num_rows == 2


def test_staging_keeps_only_what_is_not_merged_or_not_old_enough(spark, kafka, lake, checkpoints, cdc_topic):
    old, new = ((datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ") for days in (10, 1))
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [record("acme", "p1", 1, {"a": 1}, ts=old), record("acme", "p2", 1, {"a": 2}, ts=new)],
        "acme",
    )
    stage(
        spark, kafka, lake, checkpoints, cdc_topic, [record("acme", "p3", 1, {"a": 3}, ts=old)]
    )  # old, but not merged yet
    expired = expire_staging(lake, retention_seconds=7 * 86400)
    assert expired == {"acme": 1}
    assert sorted(lake.read(PROFILE_CDC_STAGING.name)["primary_id"].to_pylist()) == ["p2", "p3"]
    assert ids_of(lake, "acme") == {"p1", "p2"}
    process_tenant(spark, lake, checkpoints, "acme")
    assert ids_of(lake, "acme") == {"p1", "p2", "p3"}, "the processor still merges what came after"
