"""The engagement lake on object stores, an S3 endpoint (moto_server) and Azure's emulator (Azurite), both
on 127.0.0.1: ingestion and the mutation stream,
whose Spark tasks write their files through pyarrow's S3 file system with the lake's storage options,
commit and read back the same as on a local folder; a crash after the executors wrote their files
leaves nothing visible and the re-run commits once and deletes the dead attempt's objects. The storage
options reach the CLI's child process the way a deployment passes them: environment variables."""

from __future__ import annotations

import os
import uuid

import pytest

from engagement_platform.engagement.ingestion.apply import APP_ID as INGESTION_APP_ID
from engagement_platform.engagement.ingestion.apply import DATA_FILES
from engagement_platform.engagement.ingestion.apply import STREAM as INGESTION
from engagement_platform.engagement.mutation.apply import APP_ID as MUTATION_APP_ID
from engagement_platform.engagement.mutation.reduction.reference import apply_one_by_one
from engagement_platform.engagement.mutation.validate import request_from_json
from engagement_platform.engagement.tables import (
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_ACTIVITY_CHANGES,
    ENGAGEMENT_NOTIFICATIONS,
)
from engagement_platform.lake.changes import START, changes_since
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.file_writes import unreferenced_files, writer_tag
from engagement_platform.streams.planning import plan_next_batch
from engagement_platform_tests.support.activities import ingest, produce_activities, rows_of
from engagement_platform_tests.support.crash import finished, killed_at
from engagement_platform_tests.support.mutations import mutate, req

pytestmark = [pytest.mark.objectstore, pytest.mark.on_cluster]  # its S3 cases: a batch of every stream
COMPARED = ("engagement_id", "lead_id", "contact_id", "account_id", "user_id", "engagement_date")


@pytest.fixture(params=["s3", "azurite"])
def s3(request, monkeypatch):
    """A lake on an object store: its root and storage options, also in the environment (for child processes)."""
    server = request.getfixturevalue(f"{request.param}_server")  # one per run (conftest), a bucket per test
    with server.fresh_bucket() as options:
        bucket = options.pop("bucket")
        root = f"s3://{bucket}/lake" if request.param == "s3" else f"az://{bucket}/lake"
        for name, value in options.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("EP_LAKE_ROOT", root)
        monkeypatch.setenv("EP_ZK_ROOT", f"/tests/{uuid.uuid4().hex}")
        yield root, options


def projected(rows) -> dict:
    return {r["engagement_id"]: tuple(r.get(c) for c in COMPARED) for r in rows}


def test_ingestion_and_a_mutation_batch_on_an_object_store_commit_and_read_back(spark, kafka, topic, s3):
    root, options = s3
    lake = DeltaLake(root, options)
    checkpoints = CheckpointStore(lake)
    records = produce_activities(kafka, topic, 150)
    ingest(spark, kafka, lake, checkpoints, topic)
    before = rows_of(lake)
    assert sorted(r["engagement_id"] for r in before) == sorted(records)

    org = sorted({r["org_id"] for r in records.values()})[0]
    lead = sorted({r["lead_id"] for r in before if r["org_id"] == org and r["lead_id"]})[0]
    requests = [
        req("s1", org, 1, "convert", from_field="lead_id", from_id=lead, to_field="contact_id", to_id="003S3"),
        req("s2", org, 2, "merge", field="contact_id", from_ids=["003S3"], to_id="003S3B"),
    ]
    mutations = f"test.mutations.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({mutations: 2})
    result = mutate(spark, kafka, lake, checkpoints, mutations, requests)

    assert (result.commit_how, result.requests_applied) == ("files", 2)
    expected = apply_one_by_one([r for r in before if r["org_id"] == org], [request_from_json(r) for r in requests])
    assert projected(rows_of(lake, org)) == projected(expected.values())
    moved = {r["engagement_id"] for r in before if r["org_id"] == org and r["lead_id"] == lead}
    version = result.versions[ENGAGEMENT_ACTIVITY.name]
    logged = [r for r in lake.read(ENGAGEMENT_ACTIVITY_CHANGES.name).to_pylist() if r["_commit_version"] == version]
    assert {r["engagement_id"] for r in logged if r["_change_type"] == "update_postimage"} == moved
    changed = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, ENGAGEMENT_ACTIVITY.name, org, START).rows.to_pylist()
    assert {r["engagement_id"] for r in changed if r["_commit_version"] == version} == moved
    tag = writer_tag(MUTATION_APP_ID, result.plan.batch_id)
    assert [f for f in lake.table(ENGAGEMENT_ACTIVITY.name).file_uris() if tag in f], (
        "the tasks' objects are the table's files"
    )
    assert not [p for p in unreferenced_files(lake, ENGAGEMENT_ACTIVITY) if tag in p], "no orphan object"


def test_a_crash_after_the_executors_wrote_to_an_object_store_leaves_nothing_visible_and_the_rerun_commits_once(
    kafka, topic, s3
):
    root, options = s3
    lake = DeltaLake(root, options)
    checkpoints = CheckpointStore(lake)
    records = produce_activities(kafka, topic, 200)
    plan = plan_next_batch(INGESTION, topic, None, kafka.watermarks(topic), 100_000)
    assert checkpoints.record_plan(plan)

    killed_at(INGESTION, root, plan.batch_id, DATA_FILES)
    orphans = unreferenced_files(lake, ENGAGEMENT_ACTIVITY)
    assert orphans, "the executors had written objects"
    assert lake.read(ENGAGEMENT_ACTIVITY.name).num_rows == 0, "uncommitted objects are invisible"

    finished(INGESTION, root, plan.batch_id)
    assert unreferenced_files(lake, ENGAGEMENT_ACTIVITY) == [], "the dead attempt's objects are deleted"
    assert sorted(r["engagement_id"] for r in rows_of(lake)) == sorted(records)
    assert lake.committed_version(ENGAGEMENT_ACTIVITY.name, INGESTION_APP_ID) == plan.batch_id
    assert os.environ["EP_LAKE_ROOT"] == root


def test_profile_cdc_staged_and_merged_by_spark_tasks_on_an_object_store(spark, kafka, s3):
    """The profile lake too: the dumper stages, the processor's Spark tasks read the staged and raw files
    and hand their MERGE sources over through the object store, and the driver MERGEs."""
    import json

    from engagement_platform.profiles.processor.apply import read_profiles
    from engagement_platform_tests.support.cdc import new_topic, record, stage_and_process

    root, options = s3
    lake = DeltaLake(root, options)
    checkpoints = CheckpointStore(lake)
    topic = new_topic(kafka)
    _, first = stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        topic,
        [
            record("acme", "1", 1, {"email": "a@x.io", "country": "DE"}),
            record("acme", "1", 2, {"country": "FR"}),
            record("acme", "2", 1, {"email": "b@x.io"}),
        ],
        "acme",
    )
    _, second = stage_and_process(
        spark, kafka, lake, checkpoints, topic, [record("acme", "2", 2, {"city": "Paris"})], "acme"
    )
    rows = {r["primary_id"]: json.loads(r["fields"]) for r in read_profiles(lake, "acme").to_pylist()}
    assert rows == {"1": {"email": "a@x.io", "country": "FR"}, "2": {"email": "b@x.io", "city": "Paris"}}
    assert (first.changes_read, second.changes_read) == (3, 1)


def test_racing_writers_and_vacuum_on_an_object_store(s3):
    """Two writers racing on one table: one commits, the other gets delta-rs's conflict, as on a local
    folder (S3 through conditional put). Vacuum lists and deletes removed files on the store."""
    import pyarrow.fs as pafs
    from deltalake.exceptions import CommitFailedError

    from engagement_platform.lake.delta import BatchTxn
    from engagement_platform.lake.file_writes import commit_files, filesystem, write_files, writer_tag
    from engagement_platform_tests.support.files import SPEC, rows

    root, options = s3
    lake = DeltaLake(root, options)
    uri = lake.uri(SPEC.name)
    commit_files(
        lake,
        SPEC,
        write_files(uri, SPEC, rows(["a", "a", "b"]), writer_tag("ingest", 1), options),
        BatchTxn("ingest", 1),
    )
    first, second = lake.table(SPEC.name), lake.table(SPEC.name)  # both read the same version
    first.delete("org_id = 'a'")
    with pytest.raises(CommitFailedError):
        second.delete("org_id = 'a'")
    assert sorted(lake.read(SPEC.name)["org_id"].to_pylist()) == ["b"]

    fs, path = filesystem(uri, options)

    def data_files() -> set[str]:
        return {
            i.path
            for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))
            if i.path.endswith(".parquet") and "_delta_log" not in i.path
        }

    before = data_files()
    vacuumed = lake.table(SPEC.name).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert vacuumed and len(data_files()) == len(before) - len(vacuumed)
    assert sorted(lake.read(SPEC.name)["org_id"].to_pylist()) == ["b"], "vacuum removed only unreferenced files"


def test_landing_files_under_an_object_store_prefix_are_found_ingested_once_and_expired(spark, s3, monkeypatch):
    """Landing pipelines on an object store: the glob lists the prefix (an in-flight dot-file is not a file
    yet), the Spark tasks read the file through the store, the batch commits once (a re-run adds nothing),
    and landing retention deletes the file once its batch is done."""
    from datetime import timedelta
    from pathlib import Path

    import pyarrow.fs as pafs

    from engagement_platform.ingest.config import load_pipeline
    from engagement_platform.lake.file_writes import filesystem
    from engagement_platform.landing.apply import file_plan, landing_files, run_file_batch
    from engagement_platform.landing.demo import write_members_file
    from engagement_platform.landing.files import join
    from engagement_platform.landing.retention import expire_landed_files

    root, options = s3
    landing_root = root.rsplit("/", 1)[0] + "/landing"
    monkeypatch.setenv("EP_LANDING_ROOT", landing_root)
    lake = DeltaLake(root, options)
    checkpoints = CheckpointStore(lake)
    config = load_pipeline(Path(__file__).resolve().parent.parent / "pipelines" / "rewards_members.yaml")
    folder = join(landing_root, "rewards_members")
    landed = write_members_file(folder, "members-1.csv", 300, seed=1, bad_ratio=0.1, storage_options=options)
    fs, base = filesystem(folder, options)
    with fs.open_output_stream(f"{base}/.members-2.csv.partial") as out:  # an upload still in flight
        out.write(b"id,name\n")

    (found,) = landing_files(landing_root, config)
    assert found.path == landed and found.size == fs.get_file_info(f"{base}/members-1.csv").size

    plan = file_plan(config, 1, found.path, found.size)
    assert checkpoints.record_plan(plan)
    result = run_file_batch(spark, lake, checkpoints, config, plan)
    again = run_file_batch(spark, lake, checkpoints, config, plan)  # a re-run of the same batch
    target, quarantine = lake.read(config.target.table), lake.read(config.target.quarantine_table)
    assert (
        result.records_read == 300
        and result.rows_written + result.rows_rejected == 300
        and 0 < result.rows_rejected < 300
    )
    assert (
        target.num_rows == result.rows_written
        and len(set(quarantine["source_offset"].to_pylist())) == result.rows_rejected
    )
    assert set(quarantine["source"].to_pylist()) == {landed} and again.versions == {k: None for k in again.versions}

    assert expire_landed_files(landing_root, [config], checkpoints, timedelta(0)) == [landed]
    assert (
        landing_files(landing_root, config) == []
        and fs.get_file_info(f"{base}/members-1.csv").type == pafs.FileType.NotFound
    )


def test_a_whole_json_document_on_an_object_store_is_one_record_per_element(spark, s3, monkeypatch):
    """A landing file that is one JSON document (an array) under an object-store prefix: read in a Spark
    task through the store, one record per element, the bad elements quarantined with their index and
    JSON; a document that does not parse is one quarantined record with its text. Counts balance."""
    import json

    import yaml

    from engagement_platform.ingest.config import PipelineConfig
    from engagement_platform.landing.apply import file_plan, landing_files, run_file_batch
    from engagement_platform.landing.files import join, land

    root, options = s3
    landing_root = root.rsplit("/", 1)[0] + "/landing"
    monkeypatch.setenv("EP_LANDING_ROOT", landing_root)
    lake = DeltaLake(root, options)
    checkpoints = CheckpointStore(lake)
    config = PipelineConfig.model_validate(
        yaml.safe_load("""
name: orders
source: {format: json, path: "orders/*.json", columns: {id: string, qty: string}}
target:
  table: orders
  quarantine_table: quarantine_orders
  columns: {id: {type: long, required: true}, qty: {type: int, min: 1}}
""")
    )
    elements = [{"id": "1", "qty": "2"}, {"id": "x", "qty": "3"}, {"id": "3", "qty": "0"}, {"id": "4", "qty": "5"}]
    land(join(landing_root, "orders"), "a.json", json.dumps(elements, indent=2).encode(), options)
    land(join(landing_root, "orders"), "b.json", b'[{"id": "9", ', options)
    found = landing_files(landing_root, config)
    assert [f.path.rsplit("/", 1)[1] for f in found] == ["a.json", "b.json"]
    results = []
    for batch_id, landed in enumerate(found, start=1):
        plan = file_plan(config, batch_id, landed.path, landed.size)
        assert checkpoints.record_plan(plan)
        results.append(run_file_batch(spark, lake, checkpoints, config, plan))
    target, quarantine = lake.read("orders"), lake.read("quarantine_orders").to_pylist()
    assert sorted(zip(target["id"].to_pylist(), target["qty"].to_pylist())) == [(1, 2), (4, 5)]
    assert [(r.records_read, r.rows_written, r.rows_rejected) for r in results] == [(4, 2, 2), (1, 0, 1)]
    by_position = {(r["source"].rsplit("/", 1)[1], r["source_offset"]): r for r in quarantine}
    assert sorted(by_position) == [("a.json", 1), ("a.json", 2), ("b.json", 0)]
    assert json.loads(by_position[("a.json", 1)]["raw"]) == elements[1]
    assert (
        by_position[("b.json", 0)]["error_code"] == "malformed_record"
        and by_position[("b.json", 0)]["raw"] == b'[{"id": "9", '
    )


@pytest.mark.parametrize("s3", ["s3"], indirect=True)
def test_segments_and_profile_erasure_on_an_object_store(spark, kafka, s3):
    """Segment evaluation's tasks read the raw files and write membership through the store; a profile
    erasure rewrites the raw table, staging and membership there, and puts the subject on the list."""
    import json

    from engagement_platform.lake.suppression import subject_hash
    from engagement_platform.lake.suppression_tables import load_suppressed
    from engagement_platform.profiles.erasure.apply import STREAM as ERASURE
    from engagement_platform.profiles.erasure.apply import erase_profiles_batch
    from engagement_platform.profiles.processor.apply import read_profiles
    from engagement_platform.profiles.segments.apply import evaluate_tenant, plan_evaluation
    from engagement_platform.profiles.segments.compaction import compact_tenants
    from engagement_platform.profiles.segments.definitions import parse_segment
    from engagement_platform.profiles.segments.read import segment_members
    from engagement_platform.profiles.segments.tables import PROFILE_SEGMENTS
    from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, PROFILE_ERASED_SUBJECTS
    from engagement_platform.settings import load_settings
    from engagement_platform_tests.support.cdc import new_topic, record, stage_and_process

    root, options = s3
    lake = DeltaLake(root, options)
    checkpoints = CheckpointStore(lake)
    stage_and_process(
        spark,
        kafka,
        lake,
        checkpoints,
        new_topic(kafka),
        [
            record("acme", "u1", 1, {"country": "DE"}),
            record("acme", "u2", 1, {"country": "FR"}),
            record("acme", "u3", 1, {"country": "DE"}),
        ],
        "acme",
    )
    germans = parse_segment(
        {"name": "germans", "where": {"profile": {"path": "country", "op": "=", "value": "DE"}}}, "test"
    )[0]
    first = evaluate_tenant(spark, lake, checkpoints, "acme", plan_evaluation(lake, checkpoints, "acme"), [germans])
    assert (first.members, first.entered) == (2, 2)
    (compacted,) = compact_tenants(spark, lake, ["acme"])  # the base written through the store too
    assert compacted.log_rows == 2 and set(segment_members(lake, "acme", "germans")["identity"].to_pylist()) == {
        "u1",
        "u3",
    }
    assert {r["identity"] for r in lake.read(PROFILE_SEGMENTS.name).to_pylist()} == {"u1", "u3"}

    topic = f"test.profile.erasure.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({topic: 1})
    kafka.produce(
        topic,
        [
            (
                b"e",
                json.dumps(
                    {"request_id": "e1", "tenant": "acme", "subject_id": "u1", "request_time": "2026-02-01T10:00:00Z"}
                ).encode(),
            )
        ],
    )
    plan = plan_next_batch(ERASURE, topic, None, kafka.watermarks(topic), 100)
    assert checkpoints.record_plan(plan)
    erased = erase_profiles_batch(spark, lake, checkpoints, kafka.bootstrap_servers, plan)
    assert (erased.requests_applied, erased.ids_erased) == (1, 1)
    assert {r["primary_id"] for r in read_profiles(lake, "acme", include_deleted=True).to_pylist()} == {"u2", "u3"}
    assert {r["identity"] for r in lake.read(PROFILE_SEGMENTS.name).to_pylist()} == {"u3"}
    assert set(segment_members(lake, "acme")["identity"].to_pylist()) == {"u3"}
    assert "u1" not in {r["primary_id"] for r in lake.read(PROFILE_CDC_STAGING.name).to_pylist()}
    secret = load_settings().erasure.secret
    assert load_suppressed(lake, PROFILE_ERASED_SUBJECTS, secret).pairs() == {
        ("acme", subject_hash(secret, "acme", "u1"))
    }


@pytest.mark.parametrize("s3", ["s3"], indirect=True)
def test_secrets_stay_out_of_dagster_events_and_spark_logs(spark, stack, s3, monkeypatch):
    """A landing pipeline's sensor tick and run on the S3 lake with distinctive secrets set (storage key,
    ZooKeeper digest, erasure key): none of them appears in the Dagster event log (metadata, messages,
    errors) nor in the Spark Connect server's log, although the storage options travel with the tasks."""
    from pathlib import Path

    from dagster import DagsterInstance, build_sensor_context, materialize
    from dagster._serdes import serialize_value

    from engagement_platform.ingest.config import load_pipeline
    from engagement_platform.landing.assets import pipeline_assets
    from engagement_platform.landing.files import join, land
    from engagement_platform.landing.jobs import pipeline_job
    from engagement_platform.landing.partitions import pipeline_batches
    from engagement_platform.landing.sensors import landing_sensor
    from engagement_platform.resources import CoordinatorResource, LakeResource, SparkResource
    from engagement_platform.settings import REPO_ROOT

    root, options = s3
    secrets = {
        "AWS_SECRET_ACCESS_KEY": f"aws-{uuid.uuid4().hex}",
        "EP_ZK_AUTH": f"ep:zk-{uuid.uuid4().hex}",
        "EP_ERASURE_SECRET": f"erase-{uuid.uuid4().hex}",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    options = {**options, "AWS_SECRET_ACCESS_KEY": secrets["AWS_SECRET_ACCESS_KEY"]}  # moto checks no signature
    landing_root = root.rsplit("/", 1)[0] + "/landing"
    monkeypatch.setenv("EP_LANDING_ROOT", landing_root)
    spark_log = Path(stack["EP_STATE_DIR"]) / "logs" / "spark.log"
    log_start = spark_log.stat().st_size if spark_log.exists() else 0

    config = load_pipeline(REPO_ROOT / "pipelines" / "rewards_members.yaml")
    land(
        join(landing_root, "rewards_members"),
        "stores-1.csv",
        b"id,name,bday,level,email,points\n1,Ann Lee,01/02/1990,G,ann@example.com,10\n2,x\n",
        options,
    )
    resources = {"lake": LakeResource(root=root), "coordinator": CoordinatorResource(lake=LakeResource(root=root))}
    with DagsterInstance.ephemeral() as instance:
        with build_sensor_context(instance=instance, resources=resources) as ctx:
            (request,) = landing_sensor(config, pipeline_job(config))(ctx).run_requests
        instance.add_dynamic_partitions(pipeline_batches(config).name, [request.partition_key])
        out = materialize(
            pipeline_assets(config),
            partition_key=request.partition_key,
            instance=instance,
            selection=["ingest_rewards_members"],
            resources={**resources, "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]})},
        )
        assert out.success
        events = "\n".join(serialize_value(e) for e in instance.all_logs(out.run_id))
    assert "records_read" in events  # the log holds the run's metadata: what is searched is really there
    spark_text = spark_log.read_text(errors="replace")[log_start:] if spark_log.exists() else ""
    for name, value in secrets.items():
        assert value not in events, f"{name} in the Dagster event log"
        assert value not in spark_text, f"{name} in the Spark server's log"
    assert secrets["EP_ZK_AUTH"].split(":", 1)[1] not in events


@pytest.mark.parametrize("s3", ["s3"], indirect=True)
def test_retention_and_erasure_on_an_object_store(spark, kafka, topic, s3):
    """The TTL / GDPR stream on the S3 lake: an erasure removes the subject's activities by key, audits it by
    hash and puts it on the suppression list; a later ingestion of the subject's activity drops it; an org's
    TTL deletes only that org's old rows."""
    import json

    from engagement_platform.engagement.retention.tables import GDPR_AUDIT
    from engagement_platform.engagement.tables import ENGAGEMENT_ERASED_SUBJECTS
    from engagement_platform.lake.suppression import subject_hash
    from engagement_platform.lake.suppression_tables import load_suppressed
    from engagement_platform.settings import load_settings
    from engagement_platform_tests.support.erasure import activity, gdpr, retain

    root, options = s3
    lake = DeltaLake(root, options)
    checkpoints = CheckpointStore(lake)
    subject, org, other = "00QS3SUBJECT01", "org-s3-a", "org-s3-b"
    rows = [
        activity("a1", org, "2026-01-20", lead=subject),
        activity("a2", org, "2026-01-21", lead=subject),
        activity("a3", org, "2026-01-22", lead="00QKEPT0000001"),
        activity("a4", org, "2025-01-02", lead="00QOLD00000001"),
        activity("b1", other, "2025-01-02", lead=subject),
    ]
    kafka.produce(topic, [(r["org_id"].encode(), json.dumps(r).encode()) for r in rows])
    ingest(spark, kafka, lake, checkpoints, topic)
    gdpr_topic = f"test.gdpr.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({gdpr_topic: 1})

    result = retain(
        spark,
        kafka,
        lake,
        checkpoints,
        gdpr_topic,
        [gdpr("e1", org, "erasure", subject_id=subject), gdpr("t1", org, "retention", retention_days=365)],
    )
    assert result.requests_applied == 2
    assert sorted(r["engagement_id"] for r in rows_of(lake)) == ["a3", "b1"], (
        "the subject's rows and the org's old row left; the other org's stay"
    )
    secret = load_settings().erasure.secret
    audit = {r["request_id"]: r for r in lake.read(GDPR_AUDIT.name).to_pylist()}
    assert audit["e1"]["subject_hash"] == subject_hash(secret, org, subject) and subject not in json.dumps(
        list(audit.values()), default=str
    )
    assert (org, subject_hash(secret, org, subject)) in load_suppressed(
        lake, ENGAGEMENT_ERASED_SUBJECTS, secret
    ).pairs()

    kafka.produce(topic, [(org.encode(), json.dumps(activity("a9", org, "2026-01-23", lead=subject)).encode())])
    again = ingest(spark, kafka, lake, checkpoints, topic)
    assert again.records_suppressed == 1 and "a9" not in {r["engagement_id"] for r in rows_of(lake)}, (
        "an erased person never comes back"
    )


@pytest.mark.driver_local_input  # a cluster's executors read an export on the object store (the next test)
@pytest.mark.parametrize("s3", ["s3"], indirect=True)
def test_backfill_into_a_lake_on_an_object_store(spark, s3, tmp_path):
    """A hot-store export (local JSON lines) loaded into a tenant's raw table on the S3 lake, exactly once,
    with its bad record quarantined there."""
    import json

    from engagement_platform.profiles.backfill.apply import backfill_tenant
    from engagement_platform.profiles.processor.apply import read_profiles
    from engagement_platform.profiles.tables import QUARANTINE_PROFILE_CDC, raw_table_name
    from engagement_platform_tests.support.snapshots import UNTIL, snap, write_jsonl

    root, options = s3
    lake = DeltaLake(root, options)
    checkpoints = CheckpointStore(lake)
    export = tmp_path / "export"
    export.mkdir()
    write_jsonl(
        export / "part-0.jsonl",
        [snap("1", 4, {"email": "a@x.io"}, related=["2"]), snap("2", 5, {"email": "b@x.io"}), b"{broken"],
    )
    result = backfill_tenant(spark, lake, checkpoints, "acme", export, UNTIL)
    assert (result.records_read, result.rows_valid, result.records_quarantined) == (3, 2, 1)
    rows = {r["primary_id"]: r for r in read_profiles(lake, "acme").to_pylist()}
    assert (
        set(rows) == {"1", "2"}
        and json.loads(rows["2"]["fields"]) == {"email": "b@x.io"}
        and rows["2"]["component_id"] == "1"
    )
    assert lake.read(QUARANTINE_PROFILE_CDC.name).num_rows == 1
    version = lake.table(raw_table_name("acme")).version()
    assert backfill_tenant(spark, lake, checkpoints, "acme", export, UNTIL).already_done
    assert lake.table(raw_table_name("acme")).version() == version


def test_a_backfill_export_under_an_object_store_prefix(spark, s3, tmp_path):
    """The export itself on the object store (JSON lines and Parquet, as a hot store writes them to a bucket):
    listed with sizes (a dot-file in flight is not part of it), read by Spark tasks through the store, bad
    rows quarantined with the object's URI and their line or row number; a file added later makes a new batch."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from engagement_platform.landing.files import land
    from engagement_platform.profiles.backfill.apply import backfill_tenant
    from engagement_platform.profiles.processor.apply import read_profiles
    from engagement_platform.profiles.tables import QUARANTINE_PROFILE_CDC
    from engagement_platform_tests.support.snapshots import UNTIL, snap, write_jsonl, write_parquet

    root, options = s3
    lake = DeltaLake(root, options)
    checkpoints = CheckpointStore(lake)
    export = root.rsplit("/", 1)[0] + "/exports/acme-1"
    write_jsonl(
        tmp_path / "part-0.jsonl",
        [snap("1", 4, {"email": "a@x.io"}, related=["2"]), b"{broken", snap("2", 5, {"email": "b@x.io"})],
    )
    write_parquet(
        tmp_path / "part-1.parquet",
        [snap("3", 3, {"email": "c@x.io"}, related=["7"]), snap(None, 6, {}), snap("7", 1, {})],
    )
    # as other writers leave them: nanosecond timestamps, a dictionary-encoded column, an unsigned integer
    rows = pq.read_table(tmp_path / "part-1.parquet")
    rows = rows.set_column(
        rows.schema.get_field_index("cdc_ts"), "cdc_ts", rows["cdc_ts"].cast(pa.timestamp("ns", tz="UTC"))
    )
    rows = rows.set_column(
        rows.schema.get_field_index("record_type"), "record_type", rows["record_type"].dictionary_encode()
    )
    pq.write_table(
        rows.append_column("export_shard", pa.array([7, 7, 7], pa.uint16())),
        tmp_path / "part-1.parquet",
        coerce_timestamps=None,
    )
    for name in ("part-0.jsonl", "part-1.parquet"):
        land(export, name, (tmp_path / name).read_bytes(), options)
    land(export, ".part-2.jsonl.partial", b"not yet", options)

    result = backfill_tenant(spark, lake, checkpoints, "acme", export, UNTIL)
    assert (result.records_read, result.rows_valid, result.records_quarantined) == (6, 4, 2)
    rows = {r["primary_id"]: r for r in read_profiles(lake, "acme").to_pylist()}
    assert (
        set(rows) == {"1", "2", "3", "7"}
        and json.loads(rows["3"]["fields"]) == {"email": "c@x.io"}
        and rows["7"]["component_id"] == "3"
    )
    quarantined = {q["row_id"]: q["error_code"] for q in lake.read(QUARANTINE_PROFILE_CDC.name).to_pylist()}
    assert quarantined == {
        f"{export}/part-0.jsonl:2": "malformed_record",
        f"{export}/part-1.parquet:2": "missing_required",
    }
    assert backfill_tenant(spark, lake, checkpoints, "acme", export, UNTIL).already_done

    land(
        export, "part-3.jsonl", json.dumps(snap("9", 1, {})).encode() + b"\n", options
    )  # a new export at the same path: a new batch
    assert backfill_tenant(spark, lake, checkpoints, "acme", export, UNTIL).plan.batch_id == 2


def test_a_written_file_costs_one_request_and_a_read_two(s3_server):
    """Requests per data file on the S3 endpoint, from its access log: a file the Spark tasks write is one PUT
    (not a multipart upload's three requests), and reading it back whole is a HEAD and one GET (not a GET per
    chunk of an input stream). On a real store each request is a round trip; on the local endpoint, CPU."""
    import re
    import time
    import uuid

    import pyarrow as pa

    from engagement_platform.lake.delta import TableSpec
    from engagement_platform.lake.file_writes import filesystem, read_parquet, write_files

    log = s3_server.log  # the run's endpoint: its requests are counted from the line a step starts at

    def requests_since(start: int, name: str) -> list[str]:
        """The methods of the requests on the file `name` logged since line `start`. The endpoint writes a
        line after answering, so a marker request is sent after the step and the log read until it shows."""
        marker = f"marker-{uuid.uuid4().hex}"
        fs.get_file_info(f"{base}/{marker}")
        deadline = time.monotonic() + 30
        while True:
            lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in log.read_text().splitlines()[start:]]
            if any(marker in line for line in lines) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return [line.split('"')[1].split()[0] for line in lines if '"' in line and name in line.split('"')[1]]

    with s3_server.fresh_bucket() as options:
        root = f"s3://{options.pop('bucket')}/lake/t"
        spec = TableSpec(
            "t",
            pa.schema([("org_id", pa.string()), ("n", pa.int64()), ("text", pa.string())]),
            partition_by=("org_id",),
        )
        rows = pa.table(
            {"org_id": ["a"] * 200_000, "n": list(range(200_000)), "text": [f"row {i}" for i in range(200_000)]}
        )
        fs, base = filesystem(root, options)
        start = len(log.read_text().splitlines())
        (written,) = write_files(root, spec, rows, "test", options)
        name = written.path.rsplit("/", 1)[-1]
        assert written.size > 1_000_000 and requests_since(start, name) == ["PUT"]
        start = len(log.read_text().splitlines())
        assert read_parquet(fs, f"{base}/{written.path}")["n"].to_pylist() == list(range(200_000))
        assert requests_since(start, name) == ["HEAD", "GET"]
