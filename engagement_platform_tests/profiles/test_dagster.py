"""The profile CDC lake's Dagster layer on the real stack: dumper sensor -> staging asset -> processor
sensor -> profile_raw (an identity cascade across two batches), the backfill asset under the tenant
lock, and the lag sensor's freshness-style check."""

import json

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterInstance,
    Definitions,
    SensorResult,
    build_sensor_context,
    materialize,
)

from engagement_platform.orchestration.checks import OFFSET_RANGES_CONTIGUOUS
from engagement_platform.orchestration.runs import STREAM_TAG
from engagement_platform.profiles.assets import RANGE_END_TAG, RANGE_START_TAG, profile_tenants
from engagement_platform.profiles.backfill.assets import profile_backfill
from engagement_platform.profiles.processor.apply import processor_app_id, processor_stream, read_profiles
from engagement_platform.profiles.processor.assets import profile_processor_job, profile_raw
from engagement_platform.profiles.processor.checks import (
    EVERY_TENANT_LAG_UNDER_THRESHOLD,
    NO_DUPLICATE_PRIMARY_IDS,
    REPLICATION_LAG_UNDER_THRESHOLD,
)
from engagement_platform.profiles.processor.sensors import profile_lag_sensor, profile_processor_sensor
from engagement_platform.profiles.segments.assets import profile_segments
from engagement_platform.profiles.staging.assets import (
    profile_cdc_batches,
    profile_cdc_dumper_sensor,
    profile_cdc_staging,
)
from engagement_platform.profiles.staging.checks import RECORDS_ACCOUNTED
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource
from engagement_platform_tests.support.cdc import encode, new_topic, record
from engagement_platform_tests.support.snapshots import UNTIL, snap, write_jsonl


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


@pytest.fixture
def cdc_topic(kafka, monkeypatch):
    name = new_topic(kafka)
    monkeypatch.setenv("EP_PROFILE_CDC_TOPIC", name)
    return name


@pytest.fixture
def resources(stack, lake_root):
    lake = LakeResource(root=lake_root)
    return {
        "kafka": KafkaResource(bootstrap_servers=stack["KAFKA_BOOTSTRAP_SERVERS"]),
        "lake": lake,
        "coordinator": CoordinatorResource(lake=lake),
        "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]}),
    }


def tick(sensor, instance, resources, cursor=None):
    with build_sensor_context(instance=instance, resources=resources, cursor=cursor) as ctx:
        return sensor(ctx)


def values(metadata) -> dict:
    return {k: v.value for k, v in metadata.items()}


def materialized(out, key: str) -> dict:
    (event,) = [m for m in out.get_asset_materialization_events() if m.asset_key == AssetKey(key)]
    return values(event.materialization.metadata)


def stage_via_dagster(instance, resources, cursor=None):
    """Dumper sensor tick + the staging asset's run for the partition it requested."""
    result = tick(profile_cdc_dumper_sensor, instance, resources, cursor)
    (request,) = result.run_requests
    instance.add_dynamic_partitions(profile_cdc_batches.name, [request.partition_key])
    out = materialize(
        [profile_cdc_staging],
        partition_key=request.partition_key,
        instance=instance,
        resources=resources,
        tags=request.tags,
    )
    assert out.success
    return result, out


def process_via_dagster(instance, resources, tenant="acme"):
    """Processor sensor tick + the profile_raw run it requested for `tenant`."""
    result = tick(profile_processor_sensor, instance, resources)
    (request,) = [r for r in result.run_requests if r.partition_key == tenant]
    for add in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(profile_tenants.name, list(add.partition_keys))
    out = materialize([profile_raw], partition_key=tenant, instance=instance, resources=resources, tags=request.tags)
    assert out.success
    return result, request, out


@pytest.mark.on_cluster
def test_cdc_flows_through_sensors_and_assets_with_a_cascade_across_batches(
    spark, kafka, lake, cdc_topic, instance, resources
):
    kafka.produce(
        cdc_topic,
        encode(
            [
                record("acme", "789", 1, {"a": 1}, related=["788"]),
                record("acme", "788", 1, {}),
                record("acme", "101", 2, {"b": 2}, related=["102"]),
                record("acme", "102", 2, {}),
                b"not json",
            ]
        ),
    )
    first, staged = stage_via_dagster(instance, resources)
    (observed,) = first.asset_events
    assert values(observed.metadata)["cdc_lag_messages"] == 5
    assert json.loads(first.cursor)["batch_id"] == 1
    meta = materialized(staged, "profile_cdc_staging")
    assert (meta["rows_staged"], meta["records_quarantined"]) == (4, 1)
    staged_checks = {c.check_name: c for c in staged.get_asset_check_evaluations()}
    assert set(staged_checks) == {RECORDS_ACCOUNTED, OFFSET_RANGES_CONTIGUOUS}
    accounted = staged_checks[RECORDS_ACCOUNTED]
    assert accounted.check_name == RECORDS_ACCOUNTED and accounted.passed, accounted.metadata
    assert staged_checks[OFFSET_RANGES_CONTIGUOUS].passed, staged_checks[OFFSET_RANGES_CONTIGUOUS].metadata
    assert values(accounted.metadata)["records_quarantined"] == 1

    sensed, request, ran = process_via_dagster(instance, resources)
    assert [list(r.partition_keys) for r in sensed.dynamic_partitions_requests] == [["acme"]]
    assert request.run_key == f"{processor_stream('acme')}/staging[0..1]" and request.tags[
        STREAM_TAG
    ] == processor_stream("acme")
    raw_meta = materialized(ran, "profile_raw")
    assert (
        raw_meta["changes_read"],
        raw_meta["replication_lag_seconds"],
        raw_meta["staged_unprocessed_records"],
        raw_meta["cdc_lag_messages"],
    ) == (4, 0.0, 0, 0)
    assert AssetKey("profile_progress") in {m.asset_key for m in ran.get_asset_materialization_events()}
    checks = {c.check_name: c for c in ran.get_asset_check_evaluations()}
    assert checks[REPLICATION_LAG_UNDER_THRESHOLD].passed and checks[NO_DUPLICATE_PRIMARY_IDS].passed
    assert "merged" in tick(profile_processor_sensor, instance, resources).skip_message

    # Batch 2: 103 links 789 and 101, whose rows were stored by batch 1: both components join.
    kafka.produce(cdc_topic, encode([record("acme", "103", 3, {}, related=["789", "101"])]))
    stage_via_dagster(instance, resources, first.cursor)
    _, request, ran = process_via_dagster(instance, resources)
    assert request.run_key == f"{processor_stream('acme')}/staging[2..2]"
    raw_meta = materialized(ran, "profile_raw")
    assert (raw_meta["changes_read"], raw_meta["rows_relinked"]) == (1, 4)
    everyone = ["101", "102", "103", "788", "789"]
    rows = {r["primary_id"]: r for r in read_profiles(lake, "acme").to_pylist()}
    assert {pid: r["related_ids"] for pid, r in rows.items()} == {pid: everyone for pid in everyone}
    assert json.loads(rows["789"]["fields"]) == {"a": 1}
    assert all(c.passed for c in ran.get_asset_check_evaluations())


def test_a_processor_run_that_loses_its_tenant_lock_tries_again_in_the_same_run_and_merges_once(
    kafka, lake, cdc_topic, instance, resources, monkeypatch
):
    """The processor's tenant-locked runs ride a lost lease (a session expiry, a run paused past it) out like
    the batch streams, instead of failing and waiting for the sensor's retry behind the run queue: the first
    attempt's session expires (a real expiry on the real server) before it commits, its fenced commit refuses,
    and the second attempt takes the lock on a new session, plans the tenant's batch again and merges it, once."""
    from engagement_platform.orchestration import ride_out
    from engagement_platform.profiles.processor import assets as processor_assets
    from engagement_platform.streams.batch import active_lease
    from engagement_platform_tests.support.streams import expire_session

    monkeypatch.setattr(ride_out, "RIDE_OUT_PAUSES_S", (0.2,))
    kafka.produce(
        cdc_topic, encode([record("acme", "789", 1, {"a": 1}, related=["788"]), record("acme", "788", 1, {"b": 2})])
    )
    stage_via_dagster(instance, resources)
    process_tenants, leases = processor_assets.process_tenants, []

    def losing_the_lease_at_first(*args):
        leases.append(active_lease())
        if len(leases) == 1:
            expire_session(leases[0].coordinator)
        return process_tenants(*args)

    monkeypatch.setattr(processor_assets, "process_tenants", losing_the_lease_at_first)
    _, _, ran = process_via_dagster(instance, resources)
    raw_meta = materialized(ran, "profile_raw")
    assert (raw_meta["attempts_in_run"], raw_meta["changes_read"]) == (2, 2)
    first, second = leases
    assert second.session_id != first.session_id and second.token > first.token
    merges = [c for c in lake.table("profile_raw/acme").history() if c.get("app_id") == processor_app_id("acme")]
    assert [int(c["fencing_token"]) for c in merges] == [second.token]
    rows = {r["primary_id"]: json.loads(r["fields"]) for r in read_profiles(lake, "acme").to_pylist()}
    assert rows == {"789": {"a": 1}, "788": {"b": 2}}


def processor_job_run(instance, resources, request, raise_on_error=True):
    """The processor job itself (profile_raw, then profile_segments) for a request of its sensor: the sensor
    sees the job's runs, their outcomes and their tenants."""
    job = Definitions(
        assets=[profile_raw, profile_segments], jobs=[profile_processor_job], resources=resources
    ).resolve_job_def(profile_processor_job.name)
    return job.execute_in_process(
        instance=instance, tags=request.tags, partition_key=request.partition_key, raise_on_error=raise_on_error
    )


def test_tenants_with_staged_changes_share_one_run_each_with_its_own_batch_and_materialization(
    kafka, lake, cdc_topic, instance, resources, monkeypatch
):
    """Three tenants' changes: one run of the range of their partitions merges all three (a batch, a progress
    row and a materialization per tenant, the checks over all three, segments evaluated for each); with two
    tenants per run, a range of two and a run of one; a run of many that fails sends its tenants to runs of
    their own."""
    from engagement_platform.profiles.processor import assets as processor_assets

    tenants = ["acme", "beta", "gamma"]
    kafka.produce(
        cdc_topic,
        encode([record(t, f"{t}-{i}", i, {"n": i}) for t in tenants for i in (1, 2)]),
    )
    stage_via_dagster(instance, resources)

    monkeypatch.setenv("EP_PROFILE_TENANTS_PER_RUN", "2")
    two_per_run = tick(profile_processor_sensor, instance, resources)
    assert [
        (r.partition_key, r.tags.get(RANGE_START_TAG), r.tags.get(RANGE_END_TAG)) for r in two_per_run.run_requests
    ] == [
        (None, "acme", "beta"),
        ("gamma", None, None),
    ]
    monkeypatch.delenv("EP_PROFILE_TENANTS_PER_RUN")
    sensed = tick(profile_processor_sensor, instance, resources)
    (request,) = sensed.run_requests
    assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == ("acme", "gamma")
    assert request.run_key == "profile_processor/acme..gamma/staging[0..1]"
    for add in sensed.dynamic_partitions_requests:
        instance.add_dynamic_partitions(profile_tenants.name, list(add.partition_keys))

    poisoned = processor_assets.process_tenants

    def failing(*args):
        raise RuntimeError("a fault no retry in the run rides out")

    monkeypatch.setattr(processor_assets, "process_tenants", failing)
    assert not processor_job_run(instance, resources, request, raise_on_error=False).success
    retried = tick(profile_processor_sensor, instance, resources)
    assert sorted(r.partition_key for r in retried.run_requests) == tenants  # each alone, attempt 1 of its own
    assert all("#attempt" not in r.run_key for r in retried.run_requests)

    monkeypatch.setattr(processor_assets, "process_tenants", poisoned)
    ran = processor_job_run(instance, resources, request)
    raw = {
        m.partition: values(m.metadata)
        for m in (e.materialization for e in ran.get_asset_materialization_events())
        if m.asset_key == profile_raw.key
    }
    assert {t: (meta["tenant"], meta["changes_read"], meta["tenants_in_run"]) for t, meta in raw.items()} == {
        t: (t, 2, 3) for t in tenants
    }
    segments = [
        m.partition
        for m in (e.materialization for e in ran.get_asset_materialization_events())
        if m.asset_key == profile_segments.key
    ]
    assert sorted(segments) == tenants
    checks = {c.check_name: c for c in ran.get_asset_check_evaluations()}
    assert checks[REPLICATION_LAG_UNDER_THRESHOLD].passed and checks[NO_DUPLICATE_PRIMARY_IDS].passed
    assert values(checks[NO_DUPLICATE_PRIMARY_IDS].metadata)["rows"] == 6
    for tenant in tenants:
        assert sorted(r["primary_id"] for r in read_profiles(lake, tenant).to_pylist()) == [
            f"{tenant}-1",
            f"{tenant}-2",
        ]
        (merge,) = [
            c for c in lake.table(f"profile_raw/{tenant}").history() if c.get("app_id") == processor_app_id(tenant)
        ]
        assert merge["lock_name"] == f"profile_raw/{tenant}"  # its own lock fences a tenant's MERGE
    (progress_event,) = [
        e.materialization for e in ran.get_asset_materialization_events() if e.asset_key == AssetKey("profile_progress")
    ]
    assert values(progress_event.metadata)["tenants"] == 3  # one commit of the three progress rows, one event
    (progress_commit,) = [c for c in lake.table("profile_progress").history() if "lock_name" in c]
    assert progress_commit["lock_name"] == ",".join(f"profile_raw/{t}" for t in tenants)  # every tenant's row
    progress = lake.read("profile_progress").to_pylist()
    assert sorted(r["tenant"] for r in progress) == tenants
    assert "merged" in tick(profile_processor_sensor, instance, resources).skip_message


def test_backfill_asset_commits_under_the_tenant_lock_and_reports_the_raw_partition(
    lake, instance, resources, tmp_path
):
    folder = tmp_path / "export"
    folder.mkdir()
    write_jsonl(
        folder / "snapshot.jsonl", [snap("1", 4, {"email": "a@x.io"}), snap("2", 5, {}, related=["1"]), b"{broken"]
    )
    instance.add_dynamic_partitions(profile_tenants.name, ["acme"])
    out = materialize(
        [profile_backfill],
        partition_key="acme",
        instance=instance,
        resources=resources,
        run_config={"ops": {"profile_backfill": {"config": {"path": str(folder), "until": UNTIL}}}},
    )
    assert out.success
    events = {m.asset_key.to_user_string(): m.materialization for m in out.get_asset_materialization_events()}
    assert values(events["profile_backfill"].metadata)["rows_upserted"] == 2
    assert (
        events["profile_raw"].partition == "acme"
        and values(events["profile_raw"].metadata)["stream"] == "profile_backfill/acme"
    )
    assert values(events["quarantine_profile_cdc"].metadata)["batch_id"] == 1
    (commit,) = [c for c in lake.table("profile_raw/acme").history() if c.get("app_id") == "profile.backfill/acme"]
    assert commit["lock_name"] == "profile_raw/acme" and int(commit["fencing_token"]) >= 0
    assert sorted(r["primary_id"] for r in read_profiles(lake, "acme").to_pylist()) == ["1", "2"]


def test_lag_sensor_fails_the_check_of_a_tenant_past_the_threshold(kafka, cdc_topic, instance, resources, monkeypatch):
    monkeypatch.setenv("EP_PROFILE_MAX_LAG_SECONDS", "600")
    assert tick(profile_lag_sensor, instance, resources).skip_reason is not None
    kafka.produce(
        cdc_topic,
        encode(
            [
                record("acme", "1", 1, {}, ts="2026-01-05T10:00:00Z"),
                record("acme", "2", 2, {}, ts="2026-01-05T10:20:00Z"),
                record("globex", "1", 1, {}, ts="2026-01-05T10:00:00Z"),
            ]
        ),
    )
    stage_via_dagster(instance, resources)
    kafka.produce(cdc_topic, encode([record("acme", "3", 3, {})]))  # not staged yet
    instance.add_dynamic_partitions(profile_tenants.name, ["acme", "globex"])
    result = tick(profile_lag_sensor, instance, resources)
    assert isinstance(result, SensorResult)
    observation, evaluation = result.asset_events
    assert values(observation.metadata)["cdc_lag_messages"] == 1
    assert evaluation.check_name == EVERY_TENANT_LAG_UNDER_THRESHOLD and evaluation.asset_key == AssetKey(
        "profile_progress"
    )
    assert evaluation.partition is None, (
        "one check for every tenant: a partition's check can be reported outside a run only once"
    )
    assert not evaluation.passed
    figures = values(evaluation.metadata)
    assert (
        figures["tenants"],
        figures["tenants_over_threshold"],
        figures["worst_tenant"],
        figures["over_threshold"],
    ) == (2, 1, "acme", "acme")
    assert (
        figures["acme_replication_lag_seconds"],
        figures["max_lag_seconds"],
        figures["acme_staged_unprocessed_records"],
    ) == (1200.0, 600.0, 2)
    assert figures["globex_replication_lag_seconds"] <= 600.0


def test_lag_sensor_ticks_again_and_again_on_an_instance_that_holds_its_evaluations(
    kafka, cdc_topic, instance, resources
):
    """The daemon stores what each tick reports; a second tick's report of the same check must not fail
    (it did, with a UNIQUE constraint error on asset_check_executions, while the check was per partition)."""
    kafka.produce(
        cdc_topic, encode([record("acme", "1", 1, {}, ts="2026-01-05T10:00:00Z"), record("globex", "1", 1, {})])
    )
    stage_via_dagster(instance, resources)
    instance.add_dynamic_partitions(profile_tenants.name, ["acme", "globex"])
    for _ in range(3):
        result = tick(profile_lag_sensor, instance, resources)
        for event in result.asset_events:
            instance.report_runless_asset_event(event)  # what the sensor daemon does with them
    stored = instance.event_log_storage.get_asset_check_execution_history(
        AssetCheckKey(AssetKey("profile_progress"), EVERY_TENANT_LAG_UNDER_THRESHOLD), limit=10
    )
    assert len(stored) == 3
