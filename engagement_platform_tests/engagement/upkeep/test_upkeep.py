"""The upkeep asset, its checks, sensor and schedule on a tmp lake (no Kafka or Spark needed)."""

from __future__ import annotations

import json
import random
from datetime import date, timedelta

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckSeverity,
    AssetKey,
    AssetSelection,
    DagsterRunStatus,
    RunRequest,
    SensorResult,
    SkipReason,
    build_schedule_context,
    build_sensor_context,
    instance_for_test,
    materialize,
)
from dagster._core.test_utils import create_run_for_test

from engagement_platform.engagement.ingestion.apply import STREAM
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.engagement.upkeep import assets as upkeep_module
from engagement_platform.engagement.upkeep.assets import (
    DATE_RANGES_DO_NOT_OVERLAP,
    FILE_COUNT_UNDER_LIMIT,
    UPKEEP_ASSET,
    UPKEEP_ASSETS,
    UPKEEP_CHECKS,
    UPKEEP_JOBS,
    UPKEEP_SCHEDULES,
    UPKEEP_SENSORS,
    layout_upkeep_job,
    layout_upkeep_schedule,
    layout_upkeep_sensor,
)
from engagement_platform.lake.delta import BatchTxn
from engagement_platform.resources import LakeResource
from engagement_platform.streams.kafka import OffsetRange
from engagement_platform.streams.planning import BatchPlan, KafkaSlice

ORGS = ("00D000001", "00D000002", "00D000003")
D0 = date(2026, 1, 5)


def ingest_small_appends(lake, appends: int = 8, rows_per_org: int = 40, seed: int = 5) -> None:
    """What the ingestion stream leaves behind: a small file per org per batch, dates interleaved."""
    rng = random.Random(seed)
    for batch in range(1, appends + 1):
        rows = [
            {
                "org_id": org,
                "engagement_id": f"e{batch:03d}{org[-1]}{i:04d}",
                "activity_type": "call",
                "batch_id": batch,
                "engagement_date": D0 + timedelta(days=rng.randint(0, 45)),
                "payload": json.dumps({"step": rng.randint(1, 8)}),
            }
            for org in ORGS
            for i in range(rows_per_org)
        ]
        table = pa.Table.from_pylist(rows, schema=pa.schema([ENGAGEMENT_ACTIVITY.schema.field(n) for n in rows[0]]))
        for field in ENGAGEMENT_ACTIVITY.schema:
            if field.name not in table.schema.names:
                table = table.append_column(field, pa.nulls(table.num_rows, field.type))
        lake.append(ENGAGEMENT_ACTIVITY, table, BatchTxn("engagement.ingestion", batch))


def rows_of(lake) -> list[dict]:
    return sorted(lake.read(ENGAGEMENT_ACTIVITY.name).to_pylist(), key=lambda r: r["engagement_id"])


def values(metadata) -> dict:
    return {k: v.value for k, v in metadata.items()}


def test_exported_lists():
    assert [a.key for a in UPKEEP_ASSETS] == [UPKEEP_ASSET]
    assert {k.name for c in UPKEEP_CHECKS for k in c.check_keys} == {DATE_RANGES_DO_NOT_OVERLAP, FILE_COUNT_UNDER_LIMIT}
    assert [j.name for j in UPKEEP_JOBS] == ["layout_upkeep_job"]
    assert UPKEEP_SCHEDULES == [layout_upkeep_schedule] and UPKEEP_SENSORS == [layout_upkeep_sensor]
    (upkeep_asset,) = UPKEEP_ASSETS
    assert AssetKey(ENGAGEMENT_ACTIVITY.name) in upkeep_asset.asset_deps[UPKEEP_ASSET]


def test_upkeep_asset_compacts_the_lake_and_its_checks_pass(lake_root, lake):
    ingest_small_appends(lake)
    expected = rows_of(lake)

    result = materialize([*UPKEEP_ASSETS, *UPKEEP_CHECKS], resources={"lake": LakeResource(root=lake_root)})

    assert result.success
    meta = values(result.asset_materializations_for_node("engagement_layout_upkeep")[0].metadata)
    assert meta["files_before"] == 24 and meta["files_after"] == 3
    assert meta["partitions_checked"] == 3 and meta["partitions_compacted"] == 3
    assert meta["partitions_conflicted"] == meta["partitions_unsettled"] == 0
    assert meta["max_overlap_ratio_before"] > 0.5 and meta["max_overlap_ratio"] == 0.0
    assert meta["max_files_per_partition"] == 1 and meta["mean_file_mb"] > 0
    assert "00D000001" in meta["worst_partitions"]
    assert rows_of(lake) == expected

    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert set(checks) == {DATE_RANGES_DO_NOT_OVERLAP, FILE_COUNT_UNDER_LIMIT}
    assert all(c.passed for c in checks.values()), {n: c.metadata for n, c in checks.items()}
    assert checks[DATE_RANGES_DO_NOT_OVERLAP].metadata["max_overlap_ratio"].value == 0.0
    assert checks[FILE_COUNT_UNDER_LIMIT].metadata["max_files_per_partition"].value == 1

    observed = [
        e.event_specific_data.asset_observation for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"
    ]
    assert [(o.asset_key, o.metadata["files"].value) for o in observed] == [(AssetKey(ENGAGEMENT_ACTIVITY.name), 3)]


def test_checks_warn_on_an_overlapping_layout_without_failing_the_run(lake_root, lake):
    ingest_small_appends(lake)
    config = {"max_files_per_partition": 5}
    result = materialize(
        [*UPKEEP_ASSETS, *UPKEEP_CHECKS],
        selection=AssetSelection.checks_for_assets(UPKEEP_ASSET),  # the checks alone: nothing is compacted
        resources={"lake": LakeResource(root=lake_root)},
        run_config={
            "ops": {
                f"engagement_layout_upkeep_{n}": {"config": config}
                for n in (DATE_RANGES_DO_NOT_OVERLAP, FILE_COUNT_UNDER_LIMIT)
            }
        },
    )
    assert result.success  # non-blocking warnings
    assert not result.asset_materializations_for_node("engagement_layout_upkeep")
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    overlap, count = checks[DATE_RANGES_DO_NOT_OVERLAP], checks[FILE_COUNT_UNDER_LIMIT]
    assert not overlap.passed and overlap.severity == AssetCheckSeverity.WARN
    assert (
        overlap.metadata["max_overlap_ratio"].value > 0.5 and overlap.metadata["partitions_over_threshold"].value == 3
    )
    assert all(org in overlap.metadata["worst_partitions"].value for org in ORGS)
    assert not count.passed and count.severity == AssetCheckSeverity.WARN
    assert count.metadata["max_files_per_partition"].value == 8 and count.metadata["partitions_over_limit"].value == 3


def test_upkeep_limited_to_one_org_leaves_the_others_overlapping(lake_root, lake):
    ingest_small_appends(lake)
    result = materialize(
        [*UPKEEP_ASSETS, *UPKEEP_CHECKS],
        resources={"lake": LakeResource(root=lake_root)},
        run_config={"ops": {"engagement_layout_upkeep": {"config": {"org_ids": [ORGS[0]]}}}},
    )
    assert result.success
    meta = values(result.asset_materializations_for_node("engagement_layout_upkeep")[0].metadata)
    assert meta["partitions_compacted"] == 1 and meta["files_after"] == 1 + 8 + 8
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert not checks[DATE_RANGES_DO_NOT_OVERLAP].passed
    assert checks[DATE_RANGES_DO_NOT_OVERLAP].metadata["partitions_over_threshold"].value == 2
    assert checks[FILE_COUNT_UNDER_LIMIT].passed  # 8 files <= 100


# ---- sensor and schedule ------------------------------------------------------------------------


def finish_batches(checkpoints, first: int, last: int, done: bool = True) -> None:
    for batch_id in range(first, last + 1):
        plan = BatchPlan(STREAM, batch_id, KafkaSlice("t", (OffsetRange(0, batch_id * 10, batch_id * 10 + 10),)))
        checkpoints.record_plan(plan)
        if done:
            checkpoints.mark_done(plan)


@pytest.fixture
def instance():
    with instance_for_test() as inst:  # schedules need an instance ref; the ephemeral one has none
        yield inst


def tick(instance, lake_root, cursor=None):
    with build_sensor_context(
        instance=instance, resources={"lake": LakeResource(root=lake_root)}, cursor=cursor
    ) as ctx:
        return layout_upkeep_sensor(ctx)


def test_sensor_requests_upkeep_after_every_n_completed_batches(lake_root, checkpoints, instance, monkeypatch):
    monkeypatch.setattr(upkeep_module, "UPKEEP_EVERY_BATCHES", 3)
    assert "0 batches" in tick(instance, lake_root).skip_message  # empty lake

    finish_batches(checkpoints, 1, 2)
    finish_batches(checkpoints, 3, 3, done=False)  # planned, in flight: not counted
    assert "2 batches" in tick(instance, lake_root).skip_message

    finish_batches(checkpoints, 3, 3)
    result = tick(instance, lake_root)
    assert isinstance(result, SensorResult)
    (request,) = result.run_requests
    assert request.run_key == f"layout_upkeep/{STREAM}@3,mutation@0"
    assert json.loads(result.cursor) == {"done": {STREAM: 3, "mutation": 0}}

    # Same position again: nothing new, no second request.
    assert "0 batches" in tick(instance, lake_root, result.cursor).skip_message
    finish_batches(checkpoints, 4, 6)
    (request,) = tick(instance, lake_root, result.cursor).run_requests
    assert request.run_key == f"layout_upkeep/{STREAM}@6,mutation@0"


def test_sensor_and_schedule_skip_while_an_upkeep_run_is_in_flight(lake_root, checkpoints, instance, monkeypatch):
    monkeypatch.setattr(upkeep_module, "UPKEEP_EVERY_BATCHES", 1)
    finish_batches(checkpoints, 1, 1)
    with build_schedule_context(instance=instance) as ctx:
        assert isinstance(layout_upkeep_schedule(ctx), RunRequest)

    create_run_for_test(instance, job_name=layout_upkeep_job.name, status=DagsterRunStatus.STARTED)
    assert "in flight" in tick(instance, lake_root).skip_message
    with build_schedule_context(instance=instance) as ctx:
        skipped = layout_upkeep_schedule(ctx)
    assert isinstance(skipped, SkipReason) and "in flight" in skipped.skip_message
