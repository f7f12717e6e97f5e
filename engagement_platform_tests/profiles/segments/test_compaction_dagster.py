"""Segment compaction in Dagster: the sensor requests a tenant once enough log rows wait past its base (and an
idle tick reads no table statistics), the daily schedule requests every tenant with any, the check compares the
base with the log replayed to its compaction point, and on the real stack the asset folds an evaluated tenant's
log into its base and its check passes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRequest,
    SkipReason,
    build_schedule_context,
    build_sensor_context,
    instance_for_test,
    materialize,
)

from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.orchestration.runs import STREAM_TAG
from engagement_platform.profiles.assets import profile_tenants
from engagement_platform.profiles.segments.assets import profile_segments
from engagement_platform.profiles.segments.membership_files import compaction_app_id
from engagement_platform.profiles.segments.read import segment_members
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS
from engagement_platform.profiles.segments.upkeep import assets as compaction_assets
from engagement_platform.profiles.segments.upkeep.assets import (
    BASE_EQUALS_MERGED,
    COMPACTION_JOB,
    base_equals_merged,
    compaction_stream,
    profile_segments_compaction,
    profile_segments_compaction_schedule,
    profile_segments_compaction_sensor,
)
from engagement_platform.resources import CoordinatorResource, LakeResource, SparkResource
from engagement_platform_tests.support.cdc import new_topic, record, stage_and_process

EVALUATED_AT = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)


def log_rows(tenant: str, batch_id: int, identities: range) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "tenant": tenant,
                "segment": "germans",
                "identity": f"p{i}",
                "change": "entered",
                "evaluated_at": EVALUATED_AT,
                "raw_version": batch_id,
                "batch_id": batch_id,
            }
            for i in identities
        ]
    )


def append_log(lake: DeltaLake, tenant: str, batch_id: int, identities: range) -> None:
    lake.append(PROFILE_SEGMENT_CHANGES, log_rows(tenant, batch_id, identities), BatchTxn(f"test/{tenant}", batch_id))


def run_keys(result) -> dict[str, str]:
    assert isinstance(result, list), result
    assert all(isinstance(r, RunRequest) and r.tags[STREAM_TAG] == compaction_stream(r.partition_key) for r in result)
    return {r.partition_key: r.run_key for r in result}


def test_the_sensor_requests_each_tenant_past_the_bound_once_per_log_version(tmp_path, monkeypatch):
    monkeypatch.setenv("EP_SEGMENTS_COMPACT_LOG_ROWS", "3")
    root = str(tmp_path / "lake")
    lake = DeltaLake(root)
    reads, read_statistics = [], compaction_assets.log_rows_pending

    def counted(store, tenants):  # the statistics read the memo spares an idle tick
        reads.append(tuple(tenants))
        return read_statistics(store, tenants)

    monkeypatch.setattr(compaction_assets, "log_rows_pending", counted)
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(profile_tenants.name, ["acme", "globex"])

        def tick():
            with build_sensor_context(instance=instance, resources={"lake": LakeResource(root=root)}) as ctx:
                return profile_segments_compaction_sensor(ctx)

        assert isinstance(tick(), SkipReason), "no log table yet"
        append_log(lake, "acme", 1, range(5))  # above the bound
        append_log(lake, "globex", 1, range(2))  # below it
        version = lake.table(PROFILE_SEGMENT_CHANGES.name).version()
        first = run_keys(tick())
        assert first == {"acme": f"{compaction_stream('acme')}/changes@{version}"}
        assert len(reads) == 1

        # Nothing moved: the same request (Dagster launches a run key once) and no statistics read again.
        assert run_keys(tick()) == first
        assert len(reads) == 1

        # The log moves: globex reaches the bound; acme, still uncompacted, gets the new version's key.
        append_log(lake, "globex", 2, range(2, 4))
        moved = lake.table(PROFILE_SEGMENT_CHANGES.name).version()
        assert run_keys(tick()) == {t: f"{compaction_stream(t)}/changes@{moved}" for t in ("acme", "globex")}
        assert len(reads) == 2

        # A compaction of acme in flight: only globex is requested.
        instance.add_run(
            DagsterRun(
                job_name=COMPACTION_JOB,
                run_id=str(uuid.uuid4()),
                status=DagsterRunStatus.STARTED,
                tags={"dagster/partition": "acme"},
            )
        )
        assert set(run_keys(tick())) == {"globex"}
        assert len(reads) == 2


def test_the_schedule_requests_every_tenant_with_any_log_rows_once_a_day(tmp_path, monkeypatch):
    monkeypatch.setenv("EP_SEGMENTS_COMPACT_LOG_ROWS", "1000")  # the daily request ignores the bound
    root = str(tmp_path / "lake")
    lake = DeltaLake(root)
    append_log(lake, "acme", 1, range(5))
    append_log(lake, "globex", 1, range(1))
    with instance_for_test() as instance:  # a schedule's context needs an instance it can refer to
        instance.add_dynamic_partitions(profile_tenants.name, ["acme", "globex", "initech"])  # initech logged nothing
        with build_schedule_context(
            instance=instance,
            scheduled_execution_time=datetime(2026, 1, 6, 4, 7, tzinfo=UTC),
            resources={"lake": LakeResource(root=root)},
        ) as ctx:
            result = profile_segments_compaction_schedule(ctx)
    assert run_keys(result) == {t: f"{compaction_stream(t)}/daily@2026-01-06" for t in ("acme", "globex")}


def base_rows(tenant: str, batch_id: int, identities: range) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "tenant": tenant,
                "segment": "germans",
                "identity": f"p{i}",
                "entered_at": EVALUATED_AT,
                "batch_id": batch_id,
            }
            for i in identities
        ]
    )


def test_the_check_compares_the_base_with_the_log_replayed_to_its_compaction_point(tmp_path):
    lake = DeltaLake(str(tmp_path / "lake"))
    append_log(lake, "acme", 1, range(3))
    append_log(lake, "acme", 2, range(3, 4))  # after the base's point: not in the base, nor in the replay
    lake.append(PROFILE_SEGMENTS, base_rows("acme", 1, range(3)), BatchTxn(compaction_app_id("acme"), 1))
    append_log(lake, "globex", 1, range(9))  # another tenant's log is not replayed
    check = base_equals_merged(lake, "acme")
    assert check.passed
    assert {k: v.value for k, v in check.metadata.items()} == {
        "members": 3,
        "missing": 0,
        "extra": 0,
        "duplicates": 0,
        "through": 1,
        "log_rows_replayed": 4,
    }

    lake.append(PROFILE_SEGMENTS, base_rows("acme", 1, range(2, 5)), BatchTxn("test/base", 1))  # p2 twice, p3, p4
    check = base_equals_merged(lake, "acme")
    assert not check.passed
    assert (check.metadata["extra"].value, check.metadata["duplicates"].value) == (2, 1)


@pytest.fixture
def cdc_topic(kafka):
    return new_topic(kafka)


def compaction_metadata(out) -> dict:
    (materialization,) = out.asset_materializations_for_node("profile_segments_compaction")
    return {k: v.value for k, v in materialization.metadata.items()}


def members_now(lake) -> set[tuple[str, str]]:
    members = segment_members(lake, "acme")
    return set(zip(members["segment"].to_pylist(), members["identity"].to_pylist()))


def test_the_asset_folds_an_evaluated_tenant_s_log_into_its_base_and_the_check_replays_it(
    spark, kafka, lake, lake_root, checkpoints, cdc_topic, stack, tmp_path, monkeypatch
):
    (tmp_path / "all").mkdir()
    (tmp_path / "all" / "germans.yaml").write_text(
        "name: germans\nwhere: {profile: {path: country, op: '=', value: DE}}\n"
    )
    monkeypatch.setenv("EP_SEGMENTS_DIR", str(tmp_path))
    resources = {
        "lake": LakeResource(root=lake_root),
        "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]}),
        "coordinator": CoordinatorResource(lake=LakeResource(root=lake_root)),
    }
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        cdc_topic,
        [
            record("acme", "p1", 1, {"country": "DE"}),
            record("acme", "p2", 1, {"country": "FR"}),
            record("acme", "p3", 1, {"country": "DE"}),
        ],
        "acme",
    )
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(profile_tenants.name, ["acme"])

        def run(assets):
            out = materialize(assets, partition_key="acme", instance=instance, resources=resources)
            assert out.success
            return out

        run([profile_segments])
        assert members_now(lake) == {("germans", "p1"), ("germans", "p3")}

        out = run([profile_segments_compaction])
        meta = compaction_metadata(out)
        assert meta["log_rows_folded"] > 0 and meta["members"] == 2 and meta["through"] == 1
        (check,) = out.get_asset_check_evaluations()
        assert check.check_name == BASE_EQUALS_MERGED and check.passed
        assert (check.metadata["members"].value, check.metadata["missing"].value, check.metadata["extra"].value) == (
            2,
            0,
            0,
        )
        base = {(r["segment"], r["identity"]) for r in lake.read(PROFILE_SEGMENTS.name).to_pylist()}
        assert base == members_now(lake) == {("germans", "p1"), ("germans", "p3")}

        # Another evaluation (p1 leaves, p2 enters), compacted onto the base: the check replays both batches.
        stage_and_process(
            spark,
            kafka,
            lake,
            checkpoints,
            cdc_topic,
            [record("acme", "p1", 2, {"country": "FR"}), record("acme", "p2", 2, {"country": "DE"})],
            "acme",
        )
        run([profile_segments])
        out = run([profile_segments_compaction])
        meta = compaction_metadata(out)
        assert meta["log_rows_folded"] > 0 and meta["through"] == 2 and meta["members"] == 2
        (check,) = out.get_asset_check_evaluations()
        assert check.passed and check.metadata["members"].value == 2
        assert members_now(lake) == {("germans", "p2"), ("germans", "p3")}

        # Nothing new in the log: the run says so, and the check still holds.
        out = run([profile_segments_compaction])
        meta = compaction_metadata(out)
        assert meta["log_rows_folded"] == 0 and "note" in meta
        (check,) = out.get_asset_check_evaluations()
        assert check.passed
