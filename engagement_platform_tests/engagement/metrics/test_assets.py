"""engagement_daily_metrics in Dagster on the real stack: after an ingestion batch and a mutation batch (whose
changes only the change log holds: an update moving a row to another day, deletes), the sensor requests a
refresh, the asset folds the changes and its check equals a full recomputation; nothing new, no request."""

import uuid
from datetime import UTC, date

import pytest
from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context, materialize

from engagement_platform.engagement.metrics.apply import DAILY_METRICS
from engagement_platform.engagement.metrics.assets import (
    EQUALS_RECOMPUTATION,
    engagement_daily_metrics,
    engagement_daily_metrics_sensor,
)
from engagement_platform.resources import LakeResource, SparkResource
from engagement_platform_tests.support.activities import ingest, produce_activities, rows_of
from engagement_platform_tests.support.mutations import mutate, req


@pytest.fixture
def mutation_topic(kafka) -> str:
    name = f"test.mutations.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({name: 3})
    return name


def refresh(lake_root: str, instance) -> dict:
    resources = {
        "lake": LakeResource(root=lake_root),
        "spark": SparkResource(),
    }  # SPARK_REMOTE: the test stack's server
    with build_sensor_context(instance=instance, resources=resources) as ctx:
        request = engagement_daily_metrics_sensor(ctx)
    assert isinstance(request, RunRequest), request
    out = materialize([engagement_daily_metrics], instance=instance, resources=resources, tags=request.tags)
    assert out.success
    (check,) = out.get_asset_check_evaluations()
    assert check.check_name == EQUALS_RECOMPUTATION and check.passed, check.metadata
    return {k: v.value for k, v in check.metadata.items()}


def test_metrics_follow_ingestion_and_a_logged_mutation_batch(
    spark, kafka, topic, mutation_topic, lake, lake_root, checkpoints
):
    records = produce_activities(kafka, topic, 80)
    ingest(spark, kafka, lake, checkpoints, topic)
    with DagsterInstance.ephemeral() as instance:
        first = refresh(lake_root, instance)
        assert first["activities_stored"] == first["activities_expected"] == len(rows_of(lake))

        org = sorted({r["org_id"] for r in records.values()})[0]
        mine = sorted(r["engagement_id"] for r in rows_of(lake, org))
        result = mutate(
            spark,
            kafka,
            lake,
            checkpoints,
            mutation_topic,
            [
                req(
                    "u1",
                    org,
                    1,
                    "update",
                    engagement_id=mine[0],
                    record={"engagement_date": "2026-03-01", "subject": "moved"},
                ),
                req("d1", org, 2, "delete", engagement_id=mine[1]),
            ],
        )
        assert result.requests_applied == 2 and result.rows_deleted == 1
        second = refresh(lake_root, instance)
        assert second["activities_stored"] == first["activities_stored"] - 1
        moved = [
            r
            for r in lake.read(DAILY_METRICS.name).to_pylist()
            if r["org_id"] == org and r["engagement_date"] == date(2026, 3, 1)
        ]
        assert sum(r["activities"] for r in moved) >= 1

        with build_sensor_context(instance=instance, resources={"lake": LakeResource(root=lake_root)}) as ctx:
            assert isinstance(engagement_daily_metrics_sensor(ctx), SkipReason)


def test_metrics_stay_exact_when_retention_removes_old_rows_after_a_logged_delete_they_have_not_read(
    spark, kafka, topic, mutation_topic, lake, lake_root, checkpoints
):
    """A mutation batch deletes a row (a delete only its change log holds), then, before the metrics read it, TTL
    retention removes the log's rows older than its cut-off: were that delete among them, the metrics would count
    the row forever. Retention redacts those log rows instead."""
    from datetime import datetime, timedelta

    from engagement_platform_tests.support.erasure import gdpr, retain

    gdpr_topic = f"test.gdpr.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({gdpr_topic: 1})
    records = produce_activities(kafka, topic, 60)
    ingest(spark, kafka, lake, checkpoints, topic)
    with DagsterInstance.ephemeral() as instance:
        refresh(lake_root, instance)
        org = sorted({r["org_id"] for r in records.values()})[0]
        target = min(rows_of(lake, org), key=lambda r: r["engagement_date"])["engagement_id"]
        assert (
            mutate(
                spark, kafka, lake, checkpoints, mutation_topic, [req("d1", org, 1, "delete", engagement_id=target)]
            ).rows_deleted
            == 1
        )
        now = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        result = retain(
            spark, kafka, lake, checkpoints, gdpr_topic, [gdpr("t1", org, "retention", at=now, retention_days=1)]
        )
        assert sum(result.rows_removed.values()) > 0, (
            "the TTL cut-off covers the org's rows, the deleted one's date included"
        )
        after = refresh(lake_root, instance)  # reads the mutation's logged delete only now
        assert after["keys_differing"] == 0 and after["activities_stored"] == len(rows_of(lake))
        log = lake.read("engagement_activity_changes").to_pylist()
        assert [r["_change_type"] for r in log if r["engagement_id"] == target] == ["delete"]
        assert all(r["lead_id"] is None and r["subject"] is None for r in log if r["org_id"] == org), (
            "the log's old rows are redacted"
        )
