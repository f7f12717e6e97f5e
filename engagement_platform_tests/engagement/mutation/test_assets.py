"""The mutation stream in Dagster: its sensor plans a slice of requests, the partitioned asset applies
it (one MERGE) and its four checks pass with their numbers."""

import uuid

from dagster import DagsterInstance, SensorResult, build_sensor_context, materialize

from engagement_platform.engagement.mutation import apply as mutations
from engagement_platform.engagement.mutation.assets import (
    engagement_mutation,
    engagement_mutation_sensor,
    mutation_batches,
)
from engagement_platform.orchestration.runs import STREAM_TAG
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource
from engagement_platform_tests.support.activities import ingest, produce_activities, rows_of
from engagement_platform_tests.support.mutations import mutate, produce_requests, req


def test_sensor_plans_and_the_asset_applies_a_mutation_batch_with_checks(
    spark, kafka, topic, lake, lake_root, checkpoints, stack, monkeypatch
):
    mutation_topic = f"test.mutations.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({mutation_topic: 3})
    monkeypatch.setenv("EP_MUTATIONS_TOPIC", mutation_topic)
    good = produce_activities(kafka, topic, 40)
    ingest(spark, kafka, lake, checkpoints, topic)
    lead_rows = [r for r in good.values() if r.get("lead_id")]
    org, lead = lead_rows[0]["org_id"], lead_rows[0]["lead_id"]
    produce_requests(
        kafka,
        mutation_topic,
        [
            {
                "request_id": "r1",
                "org_id": org,
                "request_time": "2026-02-01T00:00:00Z",
                "op": "convert",
                "from_field": "lead_id",
                "from_id": lead,
                "to_field": "contact_id",
                "to_id": "003CONVERTED",
            },
            b"not json",
        ],
    )
    resources = {
        "kafka": KafkaResource(bootstrap_servers=stack["KAFKA_BOOTSTRAP_SERVERS"]),
        "lake": LakeResource(root=lake_root),
        "coordinator": CoordinatorResource(lake=LakeResource(root=lake_root)),
    }
    with DagsterInstance.ephemeral() as instance:
        with build_sensor_context(instance=instance, resources=resources) as ctx:
            result = engagement_mutation_sensor(ctx)
        assert isinstance(result, SensorResult)
        (request,) = result.run_requests
        assert request.tags[STREAM_TAG] == mutations.STREAM and mutation_topic in request.run_key
        assert result.asset_events[0].asset_key.to_user_string() == "kafka/engagement_mutations"

        instance.add_dynamic_partitions(mutation_batches.name, [request.partition_key])
        out = materialize(
            [engagement_mutation],
            partition_key=request.partition_key,
            instance=instance,
            tags=request.tags,
            resources={**resources, "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]})},
        )
    assert out.success
    checks = {e.check_name: e for e in out.get_asset_check_evaluations()}
    assert all(c.passed for c in checks.values()), {n: c.metadata for n, c in checks.items()}
    assert checks["requests_accounted"].metadata["requests_read"].value == 2
    assert checks["requests_accounted"].metadata["requests_malformed"].value == 1
    assert checks["notifications_match_changes"].metadata["orgs_changed"].value == 1
    (metadata,) = [
        m.metadata
        for m in out.asset_materializations_for_node("engagement_mutation")
        if m.asset_key.to_user_string() == "engagement_mutation"
    ]
    converted = [r for r in rows_of(lake, org) if r["contact_id"] == "003CONVERTED"]
    assert metadata["rows_updated"].value == len(converted) == sum(r.get("lead_id") == lead for r in good.values())
    assert not [r for r in rows_of(lake, org) if r["lead_id"] == lead]


def test_sensor_retries_pending_requests_after_ingestion_without_new_requests(
    spark, kafka, topic, lake, lake_root, checkpoints, stack, monkeypatch
):
    """A request arrives before its activity (pending); the activity is ingested; with no new request the next
    tick plans an empty slice that only re-evaluates the pending table, and its run applies the request."""
    import json

    from dagster import SkipReason

    from engagement_platform.engagement.mutation.assets import RETRY_TAG
    from engagement_platform.engagement.mutation.tables import (
        ENGAGEMENT_MUTATION_REQUESTS,
        ENGAGEMENT_MUTATIONS_PENDING,
    )

    org, resources = one_pending_request(
        spark, kafka, topic, lake, lake_root, checkpoints, stack, monkeypatch, "early", "00QLATE", "003NEW"
    )
    with DagsterInstance.ephemeral() as instance:
        with build_sensor_context(instance=instance, resources=resources) as ctx:
            idle = engagement_mutation_sensor(ctx)
        assert isinstance(idle, SkipReason) or not idle.run_requests, (
            "no ingestion since the last mutation batch: nothing to retry"
        )

        late = {
            "engagement_id": "late-1",
            "org_id": org,
            "activity_type": "call",
            "event_time": "2026-01-20T09:00:00Z",
            "lead_id": "00QLATE",
        }
        kafka.produce(topic, [(org.encode(), json.dumps(late).encode())])
        ingested = ingest(spark, kafka, lake, checkpoints, topic)
        with build_sensor_context(instance=instance, resources=resources) as ctx:
            result = engagement_mutation_sensor(ctx)
        assert isinstance(result, SensorResult)
        (request,) = result.run_requests
        batch_id = int(request.partition_key)
        assert batch_id == 2 and request.tags[RETRY_TAG] == str(ingested.plan.batch_id) == "2"
        assert request.run_key.endswith(f"/retry-after-ingestion-{request.tags[RETRY_TAG]}")
        plan = checkpoints.plan(mutations.STREAM, batch_id)
        assert plan.record_count == 0 and plan.ends() == checkpoints.plan(mutations.STREAM, 1).ends(), (
            "an empty slice: same next offsets"
        )
        assert json.loads(result.cursor)["batch_id"] == batch_id

        instance.add_dynamic_partitions(mutation_batches.name, [request.partition_key])
        out = materialize(
            [engagement_mutation],
            partition_key=request.partition_key,
            instance=instance,
            tags=request.tags,
            resources={**resources, "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]})},
        )
        assert out.success
        checks = {e.check_name: e for e in out.get_asset_check_evaluations()}
        assert all(c.passed for c in checks.values()), {n: c.metadata for n, c in checks.items()}

        with build_sensor_context(instance=instance, resources=resources) as ctx:
            again = engagement_mutation_sensor(ctx)
        assert isinstance(again, SkipReason) or not again.run_requests, (
            "retried once per ingestion progress, not on every tick"
        )

    (metadata,) = [
        m.metadata
        for m in out.asset_materializations_for_node("engagement_mutation")
        if m.asset_key.to_user_string() == "engagement_mutation"
    ]
    assert (
        metadata["requests_read"].value,
        metadata["pending_resolved"].value,
        metadata["pending_retained"].value,
    ) == (0, 1, 0)
    row = [r for r in rows_of(lake, org) if r["engagement_id"] == "late-1"][0]
    assert (row["lead_id"], row["contact_id"]) == (None, "003NEW")
    assert lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).num_rows == 0
    assert lake.read(ENGAGEMENT_MUTATION_REQUESTS.name).column("request_id").to_pylist() == ["early"]


def test_a_pending_request_whose_target_never_comes_expires_when_its_horizon_runs_out_in_a_quiet_system(
    spark, kafka, topic, lake, lake_root, checkpoints, stack, monkeypatch
):
    """A request held back for a target that never comes would stay pending for good, as nothing retries it while
    no activity arrives (benchmarks/soak, seed 53, makes one). Its age horizon running out is a reason for
    an empty batch: the request expires to quarantine then, once, and the tick after asks for nothing."""
    import json
    import time
    from datetime import timedelta

    from dagster import SkipReason

    from engagement_platform.engagement.mutation.apply import TARGET_NOT_FOUND
    from engagement_platform.engagement.mutation.assets import EXPIRY_TAG, RETRY_TAG
    from engagement_platform.engagement.mutation.tables import ENGAGEMENT_MUTATIONS_PENDING

    _, resources = one_pending_request(
        spark, kafka, topic, lake, lake_root, checkpoints, stack, monkeypatch, "never", "00QNEVER", "003NEVER"
    )

    def tick(instance):
        with build_sensor_context(instance=instance, resources=resources) as ctx:
            return engagement_mutation_sensor(ctx)

    with DagsterInstance.ephemeral() as instance:
        quiet = tick(instance)  # the default horizon (72 h) is far off, and nothing was ingested since
        assert isinstance(quiet, SkipReason) or not quiet.run_requests

        max_age_s = 2.0
        monkeypatch.setenv("EP_MUTATION_PENDING_MAX_AGE_HOURS", str(max_age_s / 3600))
        (seen,) = lake.read(ENGAGEMENT_MUTATIONS_PENDING.name)["first_seen_at"].to_pylist()
        time.sleep(max(seen.timestamp() + max_age_s - time.time(), 0) + 0.5)
        result = tick(instance)
        assert isinstance(result, SensorResult)
        (request,) = result.run_requests
        assert request.partition_key == "00000002" and RETRY_TAG not in request.tags
        assert request.tags[EXPIRY_TAG] == (seen + timedelta(seconds=max_age_s)).isoformat()
        assert request.run_key.endswith(f"/expire-pending-due-{request.tags[EXPIRY_TAG]}")
        assert checkpoints.plan(mutations.STREAM, 2).record_count == 0, (
            "an empty slice: it only re-evaluates the pending table"
        )

        instance.add_dynamic_partitions(mutation_batches.name, [request.partition_key])
        out = materialize(
            [engagement_mutation],
            partition_key=request.partition_key,
            instance=instance,
            tags=request.tags,
            resources={**resources, "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]})},
        )
        assert out.success
        checks = {e.check_name: e for e in out.get_asset_check_evaluations()}
        assert all(c.passed for c in checks.values()), {n: c.metadata for n, c in checks.items()}
        again = tick(instance)
        assert isinstance(again, SkipReason) or not again.run_requests, (
            "the horizon is asked about once, not on every tick"
        )

    (metadata,) = [
        m.metadata
        for m in out.asset_materializations_for_node("engagement_mutation")
        if m.asset_key.to_user_string() == "engagement_mutation"
    ]
    assert (metadata["requests_read"].value, metadata["pending_expired"].value) == (0, 1)
    assert lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).num_rows == 0
    quarantined = [r for r in lake.read("quarantine_engagement_mutations").to_pylist() if r["batch_id"] == 2]
    assert [(r["error_code"], json.loads(r["input"])["request_id"]) for r in quarantined] == [
        (TARGET_NOT_FOUND, "never")
    ]
    assert "within the age horizon" in quarantined[0]["message"], quarantined[0]["message"]


def one_pending_request(
    spark, kafka, topic, lake, lake_root, checkpoints, stack, monkeypatch, request_id: str, lead: str, contact: str
):
    """20 activities ingested, then one mutation batch whose only request converts a lead no row holds yet: it waits
    in pending. (its org, the resources a sensor tick and a run need)"""
    mutation_topic = f"test.mutations.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({mutation_topic: 3})
    monkeypatch.setenv("EP_MUTATIONS_TOPIC", mutation_topic)
    records = produce_activities(kafka, topic, 20)
    ingest(spark, kafka, lake, checkpoints, topic)
    org = sorted({r["org_id"] for r in records.values()})[0]
    first = mutate(
        spark,
        kafka,
        lake,
        checkpoints,
        mutation_topic,
        [req(request_id, org, 1, "convert", from_field="lead_id", from_id=lead, to_field="contact_id", to_id=contact)],
    )
    assert first.pending_added == 1
    resources = {
        "kafka": KafkaResource(bootstrap_servers=stack["KAFKA_BOOTSTRAP_SERVERS"]),
        "lake": LakeResource(root=lake_root),
        "coordinator": CoordinatorResource(lake=LakeResource(root=lake_root)),
    }
    return org, resources
