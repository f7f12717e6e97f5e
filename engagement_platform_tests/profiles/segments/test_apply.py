"""Segment evaluation on the real stack: profiles staged and merged by the processor, every segment
evaluated in one Spark task per tenant, membership and its entries / exits committed exactly once; a
profile linked to another enters as its merged identity dictates; a deleted profile leaves every segment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRequest,
    SkipReason,
    build_sensor_context,
    materialize,
)

from engagement_platform.orchestration.runs import STREAM_TAG
from engagement_platform.profiles.assets import PROCESSOR_JOB, profile_tenants
from engagement_platform.profiles.segments.apply import (
    evaluate_tenant,
    plan_evaluation,
    segments_app_id,
    segments_stream,
)
from engagement_platform.profiles.segments.assets import profile_segments, profile_segments_sensor
from engagement_platform.profiles.segments.compaction import COMPACTION, compact_tenants
from engagement_platform.profiles.segments.definitions import parse_segment
from engagement_platform.profiles.segments.membership_files import compaction_app_id
from engagement_platform.profiles.segments.read import segment_members
from engagement_platform.profiles.segments.reference import members
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS
from engagement_platform.resources import LakeResource, SparkResource
from engagement_platform.streams.batch import FAILPOINT_ENV
from engagement_platform.streams.pin import pin_batch
from engagement_platform.streams.slices import TableVersionsSlice
from engagement_platform_tests.support.cdc import new_topic, record, stage_and_process
from engagement_platform_tests.support.crash import KILLED, after_commit, finished, killed_at

SEGMENTS = [
    parse_segment(d, "test")[0]
    for d in (
        {"name": "germans", "where": {"profile": {"path": "country", "op": "=", "value": "DE"}}},
        {
            "name": "vip_linked",
            "where": {
                "all": [
                    {"ids": {"op": ">=", "value": 2}},
                    {"exists": {"where": {"path": "fields.tier", "op": "=", "value": "vip"}}},
                ]
            },
        },
    )
]


@pytest.fixture
def cdc_topic(kafka):
    return new_topic(kafka)


def evaluate(spark, lake, checkpoints):
    plan = plan_evaluation(lake, checkpoints, "acme")
    return evaluate_tenant(spark, lake, checkpoints, "acme", plan, SEGMENTS)


def membership(lake) -> set[tuple[str, str]]:
    """The tenant's current members: the base with the log merged on read."""
    members = segment_members(lake, "acme")
    return set(zip(members["segment"].to_pylist(), members["identity"].to_pylist()))


def base_rows(lake) -> set[tuple[str, str]]:
    """What the compacted base itself holds."""
    if not lake.exists(PROFILE_SEGMENTS.name):
        return set()
    return {(r["segment"], r["identity"]) for r in lake.read(PROFILE_SEGMENTS.name).to_pylist()}


def test_membership_follows_merged_identities_links_and_deletes(spark, kafka, lake, checkpoints, cdc_topic):
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [
            record("acme", "p1", 1, {"country": "DE", "tier": "vip"}),
            record("acme", "p2", 1, {"country": "FR"}),
            record("acme", "p3", 1, {"country": "DE"}),
        ],
        "acme",
    )
    first = evaluate(spark, lake, checkpoints)
    assert (first.identities_evaluated, first.members, first.entered, first.exited) == (3, 2, 2, 0)
    assert membership(lake) == {("germans", "p1"), ("germans", "p3")}

    # p2 links to p1: one identity {p1, p2}, its newest country is FR (p2's change is newer) and it is a linked vip
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [
            record("acme", "p2", 5, {"country": "FR"}, related=["p1"], ts="2026-01-05T11:00:00Z"),
            record("acme", "p3", 2, op="delete"),
        ],
        "acme",
    )
    second = evaluate(spark, lake, checkpoints)
    assert membership(lake) == {("vip_linked", "p1")}, "the merged identity's newest country is FR; p3 is deleted"
    assert (second.entered, second.exited) == (1, 2)
    changes = {
        (r["batch_id"], r["segment"], r["identity"], r["change"])
        for r in lake.read(PROFILE_SEGMENT_CHANGES.name).to_pylist()
    }
    assert changes == {
        (1, "germans", "p1", "entered"),
        (1, "germans", "p3", "entered"),
        (2, "germans", "p1", "exited"),
        (2, "germans", "p3", "exited"),
        (2, "vip_linked", "p1", "entered"),
    }
    assert not any(identity == "p3" for _, identity in membership(lake))

    # the same plan again commits nothing; a new evaluation with no change writes no entries or exits
    again = evaluate_tenant(spark, lake, checkpoints, "acme", checkpoints.plan(segments_stream("acme"), 2), SEGMENTS)
    assert set(again.versions.values()) == {None}
    third = evaluate(spark, lake, checkpoints)
    assert (third.entered, third.exited, third.members) == (0, 0, 1) and membership(lake) == {("vip_linked", "p1")}
    commits = [
        c for c in lake.table(PROFILE_SEGMENT_CHANGES.name).history() if c.get("app_id") == segments_app_id("acme")
    ]
    assert sorted(int(c["batch_id"]) for c in commits) == [1, 2, 3]


def test_the_asset_evaluates_a_tenant_reports_sizes_and_checks_a_sample_against_the_reference(
    spark, kafka, lake, lake_root, checkpoints, cdc_topic, stack, tmp_path, monkeypatch
):
    (tmp_path / "all").mkdir()
    (tmp_path / "all" / "germans.yaml").write_text(
        "name: germans\nwhere: {profile: {path: country, op: '=', value: DE}}\n"
    )
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "linked.yaml").write_text("name: linked\nwhere: {ids: {op: '>=', value: 2}}\n")
    monkeypatch.setenv("EP_SEGMENTS_DIR", str(tmp_path))
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [
            record("acme", "p1", 1, {"country": "DE"}),
            record("acme", "p2", 1, {"country": "FR"}, related=["p1"], ts="2026-01-05T11:00:00Z"),
            record("acme", "p3", 1, {"country": "DE"}),
        ],
        "acme",
    )
    with DagsterInstance.ephemeral() as instance:
        out = materialize_segments(instance, lake_root, stack)
        meta = out.asset_materializations_for_node("profile_segments")[0].metadata
        assert (
            meta["segments"].value,
            meta["identities_evaluated"].value,
            meta["size_germans"].value,
            meta["size_linked"].value,
        ) == (2, 2, 1, 1)
        (check,) = out.get_asset_check_evaluations()
        assert (
            check.passed
            and check.metadata["sampled"].value == 2
            and check.metadata["missing"].value == check.metadata["extra"].value == 0
        )

        def tick():
            return profile_segments_sensor(
                build_sensor_context(instance=instance, resources={"lake": LakeResource(root=lake_root)})
            )

        assert isinstance(tick(), SkipReason), "evaluated at the raw table's current version: nothing to request"

        # The raw table moves while a processor run of the tenant is in flight: that run evaluates the
        # segments itself after its merge, so the sensor requests nothing for the tenant until it ends.
        stage_and_process(
            spark, kafka, lake, checkpoints, cdc_topic, [record("acme", "p4", 2, {"country": "DE"})], "acme"
        )
        processor_run = instance.add_run(
            DagsterRun(
                job_name=PROCESSOR_JOB,
                run_id=str(uuid.uuid4()),
                status=DagsterRunStatus.STARTED,
                tags={"dagster/partition": "acme"},
            )
        )
        assert isinstance(tick(), SkipReason)
        instance.report_run_failed(processor_run)  # e.g. its segments step failed: this sensor picks the evaluation up
        (request,) = tick()
        assert (
            isinstance(request, RunRequest)
            and request.partition_key == "acme"
            and request.tags[STREAM_TAG] == segments_stream("acme")
        )


def test_a_string_op_on_a_path_holding_arrays_is_a_warning_in_the_run_s_metadata(
    spark, kafka, lake, lake_root, checkpoints, cdc_topic, stack, tmp_path, monkeypatch
):
    """`contains` on tags that are lists selects nobody: the run says so (metadata and log), with the count of
    records whose tags held an array; `has` selects them, and the sample check agrees with the reference."""
    (tmp_path / "all").mkdir()
    (tmp_path / "all" / "gold_text.yaml").write_text(
        "name: gold_text\nwhere: {exists: {where: {path: fields.tags, op: contains, value: gold}}}\n"
    )
    (tmp_path / "all" / "gold.yaml").write_text(
        "name: gold\nwhere: {exists: {where: {path: fields.tags, op: has, value: gold}}}\n"
    )
    monkeypatch.setenv("EP_SEGMENTS_DIR", str(tmp_path))
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [
            record("acme", "p1", 1, {"tags": ["gold", "vip"]}),
            record("acme", "p2", 1, {"tags": "gold"}),
            record("acme", "p3", 1, {"tags": ["silver"]}),
        ],
        "acme",
    )
    with DagsterInstance.ephemeral() as instance:
        out = materialize_segments(instance, lake_root, stack)
        meta = out.asset_materializations_for_node("profile_segments")[0].metadata
        assert (meta["size_gold"].value, meta["size_gold_text"].value, meta["array_records_fields.tags"].value) == (
            1,
            1,
            2,
        )
        (warning,) = meta["warnings"].value
        assert warning.startswith("fields.tags held an array in 2 of the records evaluated, and segments gold_text")
        (check,) = out.get_asset_check_evaluations()
        assert check.passed and check.metadata["sampled"].value == 3
    assert membership(lake) == {("gold", "p1"), ("gold_text", "p2")}


def materialize_segments(instance, lake_root: str, stack, tenant: str = "acme"):
    """profile_segments of the tenant's partition on this instance, with the stack's lake and Spark; it succeeded."""
    instance.add_dynamic_partitions(profile_tenants.name, [tenant])
    out = materialize(
        [profile_segments],
        partition_key=tenant,
        instance=instance,
        resources={
            "lake": LakeResource(root=lake_root),
            "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]}),
        },
    )
    assert out.success
    return out


def full_membership(lake, checkpoints, segments, batch_id: int) -> set[tuple[str, str]]:
    """What a full evaluation gives at the batch's pinned time over the raw table it read (the slow reference)."""
    plan = checkpoints.plan(segments_stream("acme"), batch_id)
    raw = plan.slice_as(TableVersionsSlice)
    identities: dict[str, list[dict]] = {}
    for r in lake.table(raw.table, raw.up_to).to_pyarrow_table().to_pylist():
        if not r["deleted"]:
            identities.setdefault(r["component_id"], []).append(r)
    now = pin_batch(lake, PROFILE_SEGMENT_CHANGES.name, segments_app_id("acme"), batch_id, []).as_of
    return {(s.name, key) for s in segments for key in members(s, identities, now)}


def test_incremental_evaluation_gives_exactly_the_full_membership(spark, kafka, lake, checkpoints, cdc_topic):
    started = time.time()
    edge = (datetime.now(UTC) - timedelta(days=1) + timedelta(seconds=45)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )  # in the 1-day window for 45 s
    segments = [*SEGMENTS, parse_segment({"name": "active_today", "where": {"exists": {"within": "1d"}}}, "test")[0]]
    rounds = [
        [
            record("acme", "p1", 1, {"country": "DE", "tier": "vip"}),
            record("acme", "p2", 1, {"country": "FR"}),
            record("acme", "p3", 1, {"country": "DE"}, ts=edge),
            record("acme", "p4", 1, {"country": "DE"}),
        ],
        [
            record("acme", "p2", 5, {"country": "FR"}, related=["p1"], ts="2026-01-05T11:00:00Z"),
            record("acme", "p4", 2, op="delete"),
        ],
        [],  # no change at all: only time moves (p3's record leaves the 1-day window)
        [record("acme", "p5", 1, {"country": "DE"}, related=["p3"]), record("acme", "p1", 7, {"tier": "gold"})],
    ]
    modes = []
    for i, changes in enumerate(rounds):
        if changes:
            stage_and_process(spark, kafka, lake, checkpoints, cdc_topic, changes, "acme")
        if i == 2:
            assert ("active_today", "p3") in membership(lake), "p3's record is still inside the window before the wait"
            time.sleep(max(0.0, started + 47 - time.time()))
        result = evaluate_tenant(spark, lake, checkpoints, "acme", plan_evaluation(lake, checkpoints, "acme"), segments)
        modes.append((result.mode, result.identities_evaluated))
        expected = full_membership(lake, checkpoints, segments, result.plan.batch_id)
        assert membership(lake) == expected, (i, result.metadata())
        assert result.members == len(expected) and sum(result.by_segment.values()) == len(expected)
        if i % 2:  # every other round the log is folded into the base: the next evaluation reads both
            (compacted,) = compact_tenants(spark, lake, ["acme"])
            assert compacted.through == result.plan.batch_id and base_rows(lake) == expected
            assert membership(lake) == expected, "compaction changes nothing a reader sees"
    assert [m for m, _ in modes] == ["full", "incremental", "incremental", "incremental"]
    assert modes[2][1] == 1, "with no row changed, only the identity whose record left a window is evaluated"
    assert ("active_today", "p3") not in membership(lake)
    changed = parse_segment(
        {"name": "germans", "where": {"profile": {"path": "country", "op": "=", "value": "FR"}}}, "test"
    )[0]
    redefined = evaluate_tenant(
        spark, lake, checkpoints, "acme", plan_evaluation(lake, checkpoints, "acme"), [changed, *segments[1:]]
    )
    assert redefined.mode == "full" and membership(lake) == full_membership(
        lake, checkpoints, [changed, *segments[1:]], redefined.plan.batch_id
    )


@pytest.mark.lake_stores("local", "s3")  # exactly-once on an object store too
@pytest.mark.parametrize("crash_after", [PROFILE_SEGMENT_CHANGES.name])
def test_killed_after_a_commit_then_rerun_evaluates_exactly_once(
    spark, kafka, lake, lake_root, checkpoints, cdc_topic, tmp_path, monkeypatch, crash_after
):
    (tmp_path / "all").mkdir()
    (tmp_path / "all" / "germans.yaml").write_text(
        "name: germans\nwhere: {profile: {path: country, op: '=', value: DE}}\n"
    )
    monkeypatch.setenv("EP_SEGMENTS_DIR", str(tmp_path))
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [record("acme", "p1", 1, {"country": "DE"}), record("acme", "p2", 1, {"country": "DE"})],
        "acme",
    )
    plan = plan_evaluation(lake, checkpoints, "acme")
    killed_at(segments_stream("acme"), lake_root, plan.batch_id, crash_after)
    finished(segments_stream("acme"), lake_root, plan.batch_id)
    assert checkpoints.is_done(segments_stream("acme"), plan.batch_id)
    assert membership(lake) == {("germans", "p1"), ("germans", "p2")}
    changes = [(r["segment"], r["identity"], r["change"]) for r in lake.read(PROFILE_SEGMENT_CHANGES.name).to_pylist()]
    assert sorted(changes) == [("germans", "p1", "entered"), ("germans", "p2", "entered")], "each entry logged once"
    logged = [
        c for c in lake.table(PROFILE_SEGMENT_CHANGES.name).history() if c.get("app_id") == segments_app_id("acme")
    ]
    assert len(logged) == 1, "one commit of the batch's changes"
    assert base_rows(lake) == set(), "an evaluation appends to the log only: the base is a compaction's"


def compact_in_a_child(lake_root: str, failpoint: str | None = None) -> subprocess.CompletedProcess:
    """`engagement-platform segments-compact --tenant acme` in a child process, killed at `failpoint` if given."""
    env = {**os.environ, "EP_LAKE_ROOT": lake_root}
    env.pop(FAILPOINT_ENV, None)
    if failpoint:
        env[FAILPOINT_ENV] = failpoint
    command = [sys.executable, "-m", "engagement_platform.cli", "segments-compact", "--tenant", "acme"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("crash_after", ["files", PROFILE_SEGMENTS.name])
def test_a_compaction_killed_anywhere_then_rerun_folds_the_log_once_and_leaves_no_file_behind(
    spark, kafka, lake, lake_root, checkpoints, cdc_topic, crash_after
):
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [record("acme", "p1", 1, {"country": "DE"}), record("acme", "p2", 1, {"country": "DE"})],
        "acme",
    )
    evaluate(spark, lake, checkpoints)
    killed = compact_in_a_child(lake_root, after_commit(COMPACTION, crash_after))
    assert killed.returncode == KILLED, killed.stderr[-2000:]
    # more log comes before the re-run: it aims at a later point than the dead attempt did
    stage_and_process(spark, kafka, lake, checkpoints, cdc_topic, [record("acme", "p3", 1, {"country": "DE"})], "acme")
    second = evaluate(spark, lake, checkpoints)
    rerun = compact_in_a_child(lake_root)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    expected = {("germans", "p1"), ("germans", "p2"), ("germans", "p3")}
    assert base_rows(lake) == expected and membership(lake) == expected
    assert lake.committed_version(PROFILE_SEGMENTS.name, compaction_app_id("acme")) == second.plan.batch_id
    commits = [c for c in lake.history(PROFILE_SEGMENTS.name) if c.get("upkeep") == "segments compaction"]
    assert len(commits) == (2 if crash_after == PROFILE_SEGMENTS.name else 1), "each compaction committed once"
    base_files = {p.name for p in (Path(lake_root) / PROFILE_SEGMENTS.name).rglob("*.parquet")}
    live = {uri.rsplit("/", 1)[-1] for uri in lake.table(PROFILE_SEGMENTS.name).file_uris()}
    removed_by_a_commit = len(commits) - 1  # the first committed compaction's file, replaced by the second
    assert len(base_files - live) == removed_by_a_commit, "a dead attempt's files are deleted by the re-run"
