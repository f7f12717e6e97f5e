import pytest
from dagster import AssetKey, DagsterInstance, materialize

from engagement_platform.engagement.assets import INGESTION_ASSET
from engagement_platform.engagement.ingestion.apply import STREAM
from engagement_platform.engagement.ingestion.assets import engagement_ingestion, ingestion_batches
from engagement_platform.engagement.ingestion.checks import NO_DUPLICATE_ENGAGEMENT_IDS
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.orchestration.checks import (
    NOTIFICATIONS_MATCH_CHANGES,
    OFFSET_RANGES_CONTIGUOUS,
    RECORDS_CONSERVED,
)
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource
from engagement_platform.streams.planning import plan_next_batch
from engagement_platform_tests.support.activities import BAD_RECORDS, produce_activities


@pytest.mark.on_cluster
def test_materializing_a_batch_commits_reports_tables_and_passes_its_checks(
    spark, stack, kafka, topic, lake_root, checkpoints
):
    produce_activities(kafka, topic, 150, bad=BAD_RECORDS)
    plan = plan_next_batch(STREAM, topic, None, kafka.watermarks(topic), 1000)
    checkpoints.record_plan(plan)
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(ingestion_batches.name, [plan.partition_key])
        result = materialize(
            [engagement_ingestion],
            partition_key=plan.partition_key,
            instance=instance,
            resources={
                "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]}),
                "lake": LakeResource(root=lake_root),
                "kafka": KafkaResource(bootstrap_servers=kafka.bootstrap_servers),
                "coordinator": CoordinatorResource(lake=LakeResource(root=lake_root)),
            },
        )
        assert result.success
        (mat,) = [
            m for m in result.asset_materializations_for_node("engagement_ingestion") if m.asset_key == INGESTION_ASSET
        ]
        meta = {k: v.value for k, v in mat.metadata.items()}
        assert meta["rows_appended"] == 150 and meta["rows_rejected"] == len(BAD_RECORDS)
        assert meta["offset_ranges"] == plan.ranges_json()
        assert meta["engagement_activity_version"] == 1

        reported = {e.event_specific_data.materialization.asset_key for e in result.get_asset_materialization_events()}
        assert {
            AssetKey("engagement_activity"),
            AssetKey("engagement_notifications"),
            AssetKey("quarantine_engagement_ingestion"),
        } <= reported

        checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
        assert set(checks) == {
            NO_DUPLICATE_ENGAGEMENT_IDS,
            NOTIFICATIONS_MATCH_CHANGES,
            OFFSET_RANGES_CONTIGUOUS,
            RECORDS_CONSERVED,
        }
        assert all(c.passed for c in checks.values()), {n: c.metadata for n, c in checks.items()}
        assert checks[NO_DUPLICATE_ENGAGEMENT_IDS].metadata["duplicate_rows"].value == 0
        assert checks[RECORDS_CONSERVED].metadata["records_quarantined"].value == len(BAD_RECORDS)
        assert checks[NOTIFICATIONS_MATCH_CHANGES].metadata["rows_notified"].value == 150


def test_a_replayed_batch_is_quarantined_and_the_duplicate_check_catches_another_writer(
    spark, stack, kafka, topic, lake_root, checkpoints
):
    produce_activities(kafka, topic, 30)
    produce_activities(kafka, topic, 30)  # the same ids again: an upstream replay
    resources = {
        "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]}),
        "lake": LakeResource(root=lake_root),
        "kafka": KafkaResource(bootstrap_servers=kafka.bootstrap_servers),
        "coordinator": CoordinatorResource(lake=LakeResource(root=lake_root)),
    }
    lake = DeltaLake(lake_root)
    with DagsterInstance.ephemeral() as instance:

        def run_batch(watermarks):
            plan = plan_next_batch(STREAM, topic, checkpoints.latest_plan(STREAM), watermarks, 10_000)
            checkpoints.record_plan(plan)
            instance.add_dynamic_partitions(ingestion_batches.name, [plan.partition_key])
            result = materialize(
                [engagement_ingestion],
                partition_key=plan.partition_key,
                instance=instance,
                resources=resources,
                raise_on_error=False,
            )
            return {c.check_name: c for c in result.get_asset_check_evaluations()}

        marks = kafka.watermarks(topic)
        run_batch({p: (lo, lo + (hi - lo) // 2) for p, (lo, hi) in marks.items()})  # the first copies
        replay = run_batch(marks)
        assert (
            replay[NO_DUPLICATE_ENGAGEMENT_IDS].passed
            and replay[NO_DUPLICATE_ENGAGEMENT_IDS].metadata["duplicate_rows"].value == 0
        )
        assert (
            replay[RECORDS_CONSERVED].passed and replay[RECORDS_CONSERVED].metadata["records_quarantined"].value == 30
        )

        # A writer outside the stream appends copies of existing rows: the next batch's check reports them.
        copies = lake.read(ENGAGEMENT_ACTIVITY.name).slice(0, 3)
        lake.append(ENGAGEMENT_ACTIVITY, copies, BatchTxn("another.writer", 1))
        produce_activities(kafka, topic, 10, seed=5)
        after = run_batch(kafka.watermarks(topic))
    dup = after[NO_DUPLICATE_ENGAGEMENT_IDS]
    assert not dup.passed and dup.metadata["duplicate_rows"].value == 3
