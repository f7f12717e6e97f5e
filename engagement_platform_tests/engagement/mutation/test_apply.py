"""The ID mutation stream's apply path end to end on the real broker, Spark Connect and Delta tables:
cascades, merges, deletes, updates, pending requests and their horizon, malformed requests, a process
killed between table commits, and the notifications of the MERGE."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pyarrow.compute as pc
import pyarrow.fs as pafs
import pytest

from engagement_platform.engagement.integrity import audit_notifications
from engagement_platform.engagement.mutation.apply import (
    APP_ID,
    DATA_FILES,
    STREAM,
    TARGET_NOT_FOUND,
    apply_mutation_batch,
)
from engagement_platform.engagement.mutation.reduction.reference import apply_one_by_one
from engagement_platform.engagement.mutation.requests import OWNER_FIELDS
from engagement_platform.engagement.mutation.tables import (
    ENGAGEMENT_MUTATION_REQUESTS,
    ENGAGEMENT_MUTATIONS_PENDING,
    QUARANTINE_ENGAGEMENT_MUTATIONS,
)
from engagement_platform.engagement.mutation.validate import request_from_json
from engagement_platform.engagement.tables import (
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_ACTIVITY_CHANGES,
    ENGAGEMENT_NOTIFICATIONS,
)
from engagement_platform.lake.file_writes import filesystem, unreferenced_files, writer_tag
from engagement_platform.streams.planning import plan_next_batch
from engagement_platform_tests.support.activities import ingest, produce_activities, rows_of
from engagement_platform_tests.support.crash import crash_then_rerun, finished, killed_at
from engagement_platform_tests.support.mutations import mutate, plan_mutations, produce_requests, req

COMPARED = ("engagement_id", *OWNER_FIELDS, "engagement_date")


@pytest.fixture
def mutation_topic(kafka) -> str:
    name = f"test.mutations.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({name: 3})
    return name


def projected(rows) -> dict:
    return {
        r["engagement_id"]: tuple(r.get(c) for c in COMPARED)
        for r in (rows.values() if isinstance(rows, dict) else rows)
    }


def pick(records: dict, org: str, column: str, count: int = 1) -> list[str]:
    values = sorted({r[column] for r in records.values() if r["org_id"] == org and r.get(column)})
    assert len(values) >= count
    return values[:count]


def test_cascade_merge_deletes_and_update_apply_in_one_merge(spark, kafka, topic, mutation_topic, lake, checkpoints):
    records = produce_activities(kafka, topic, 120)
    ingest(spark, kafka, lake, checkpoints, topic)
    before = rows_of(lake)
    orgs = sorted({r["org_id"] for r in records.values()})
    a, b, c = orgs[0], orgs[1], orgs[2]
    lead1 = pick(records, a, "lead_id")[0]
    lead1_rows = {r["engagement_id"] for r in before if r["lead_id"] == lead1}
    c1, c2 = pick(records, b, "contact_id", 2)
    merged_rows = {r["engagement_id"] for r in before if r["org_id"] == b and r["contact_id"] in (c1, c2)}
    user = Counter(r["user_id"] for r in before if r["org_id"] == c).most_common(1)[0][0]
    user_rows = {r["engagement_id"] for r in before if r["org_id"] == c and r["user_id"] == user}
    one_row = sorted(r["engagement_id"] for r in before if r["org_id"] == c and r["user_id"] != user)[0]
    updated = sorted(r["engagement_id"] for r in before if r["org_id"] == a and r["lead_id"] != lead1)[0]
    requests = [
        # the chain 1 -> 2 -> 3 arrives out of order: request_time decides
        req("a2", a, 2, "convert", from_field="lead_id", from_id="00QCHAIN2", to_field="lead_id", to_id="00QCHAIN3"),
        req("a1", a, 1, "convert", from_field="lead_id", from_id=lead1, to_field="lead_id", to_id="00QCHAIN2"),
        req(
            "a3",
            a,
            3,
            "update",
            engagement_id=updated,
            record={"lead_id": "00QUPD", "engagement_date": "2026-03-01", "subject": "rewritten"},
        ),
        req("b1", b, 1, "merge", field="contact_id", from_ids=[c1, c2], to_id="003MERGED"),
        req("c1", c, 1, "delete", field="user_id", id=user),
        req("c2", c, 2, "delete", engagement_id=one_row),
    ]
    result = mutate(spark, kafka, lake, checkpoints, mutation_topic, requests)

    after = rows_of(lake)
    by_id = {r["engagement_id"]: r for r in after}
    # cascade end to end: everything that was on 1 is on 3, nothing on 1 or 2
    assert {r["engagement_id"] for r in after if r["lead_id"] == "00QCHAIN3"} == lead1_rows
    assert not [r for r in after if r["lead_id"] in (lead1, "00QCHAIN2")]
    assert {r["engagement_id"] for r in after if r["contact_id"] == "003MERGED"} == merged_rows
    assert not [r for r in after if r["org_id"] == b and r["contact_id"] in (c1, c2)]
    assert not user_rows & set(by_id) and one_row not in by_id
    assert (by_id[updated]["lead_id"], str(by_id[updated]["engagement_date"]), by_id[updated]["subject"]) == (
        "00QUPD",
        "2026-03-01",
        "rewritten",
    )
    assert by_id[updated]["activity_type"] == records[updated]["activity_type"], (
        "columns the record does not name are kept"
    )
    # the same as the one-at-a-time reference, org by org; other orgs untouched
    for org in orgs:
        expected = apply_one_by_one(
            [r for r in before if r["org_id"] == org], [request_from_json(r) for r in requests if r["org_id"] == org]
        )
        assert projected(rows_of(lake, org)) == projected(expected), org

    assert (result.requests_valid, result.requests_applied, result.pending_added) == (6, 6, 0)
    assert result.rows_deleted == len(user_rows) + 1
    assert result.rows_updated == len(lead1_rows) + len(merged_rows) and result.rows_replaced == 1
    meta = result.metadata()
    assert meta["actions_after_reduction"] > 0 and meta["reduction_ratio"] == round(
        6 / meta["actions_after_reduction"], 3
    )
    # one ingestion batch wrote one file per org: the executors read and rewrite only the 3 orgs' files
    assert meta["files_total"] == len(orgs) and meta["files_read"] == 3
    assert (meta["activity_commit"], meta["commit_files_removed"], meta["commit_files_added"]) == ("files", 3, 3)
    assert result.rows_scanned < len(before), "only rows holding an id involved are kept"
    # the change log holds exactly the batch's row-level changes, at the commit's version
    version = result.versions[ENGAGEMENT_ACTIVITY.name]
    changes = Counter(
        r["_change_type"]
        for r in lake.read(ENGAGEMENT_ACTIVITY_CHANGES.name).to_pylist()
        if r["_commit_version"] == version
    )
    updated_rows = result.rows_updated + result.rows_replaced
    assert changes == {"update_preimage": updated_rows, "update_postimage": updated_rows, "delete": result.rows_deleted}

    # notifications: per org the commit's updated/deleted counts, matching its change log
    notes = lake.read(ENGAGEMENT_NOTIFICATIONS.name, filters=[("app_name", "=", APP_ID)]).to_pylist()
    per_org = {n["org_id"]: (n["updated"], n["deleted"]) for n in notes}
    assert per_org == {a: (len(lead1_rows) + 1, 0), b: (len(merged_rows), 0), c: (0, len(user_rows) + 1)}
    assert {n["table_version"] for n in notes} == {version} and {n["batch_id"] for n in notes} == {1}
    assert audit_notifications(lake, ENGAGEMENT_ACTIVITY.name, version, APP_ID, 1).orgs_mismatched == 0

    log = lake.read(ENGAGEMENT_MUTATION_REQUESTS.name).to_pylist()
    assert sorted(r["request_id"] for r in log) == sorted(r["request_id"] for r in requests)
    assert {r["outcome"] for r in log} == {"applied"} and all(
        r["source_offset"] is not None and r["request_json"] for r in log
    )
    assert checkpoints.is_done(STREAM, 1)

    # a re-run of the committed batch changes nothing
    tables = (ENGAGEMENT_ACTIVITY.name, ENGAGEMENT_MUTATION_REQUESTS.name, ENGAGEMENT_NOTIFICATIONS.name)
    versions = {t: lake.table(t).version() for t in tables}
    again = apply_mutation_batch(spark, lake, checkpoints, kafka.bootstrap_servers, checkpoints.plan(STREAM, 1))
    assert set(again.versions.values()) == {None}
    assert {t: lake.table(t).version() for t in tables} == versions
    assert again.requests_applied == 6 and again.pending_added == 0, "the re-run recomputes against the pinned snapshot"


def test_request_before_its_activity_waits_in_pending_then_applies(
    spark, kafka, topic, mutation_topic, lake, checkpoints
):
    records = produce_activities(kafka, topic, 30)
    ingest(spark, kafka, lake, checkpoints, topic)
    org = sorted({r["org_id"] for r in records.values()})[0]
    early = req(
        "early", org, 1, "convert", from_field="lead_id", from_id="00QLATE", to_field="contact_id", to_id="003NEW"
    )
    first = mutate(spark, kafka, lake, checkpoints, mutation_topic, [early])
    assert (first.pending_added, first.requests_applied, first.rows_updated) == (1, 0, 0)
    pending = lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).to_pylist()
    assert [(p["request_id"], p["first_seen_batch"], p["attempts"]) for p in pending] == [("early", 1, 1)]
    assert json.loads(pending[0]["missing_targets"]) == [{"kind": "owner", "field": "lead_id", "id": "00QLATE"}]
    assert lake.read(ENGAGEMENT_MUTATION_REQUESTS.name).column("outcome").to_pylist() == ["pending"]

    late = {
        "engagement_id": "late-1",
        "org_id": org,
        "activity_type": "call",
        "event_time": "2026-01-20T09:00:00Z",
        "lead_id": "00QLATE",
    }
    kafka.produce(topic, [(org.encode(), json.dumps(late).encode())])
    ingest(spark, kafka, lake, checkpoints, topic)
    other = pick(records, org, "lead_id")[0]
    second = mutate(
        spark,
        kafka,
        lake,
        checkpoints,
        mutation_topic,
        [req("later", org, 5, "convert", from_field="lead_id", from_id=other, to_field="lead_id", to_id="00QOTHER")],
    )
    assert (second.pending_resolved, second.requests_applied, second.pending_retained) == (1, 2, 0)
    row = [r for r in rows_of(lake, org) if r["engagement_id"] == "late-1"][0]
    assert (row["lead_id"], row["contact_id"]) == (None, "003NEW")
    assert lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).num_rows == 0
    notes = lake.read(
        ENGAGEMENT_NOTIFICATIONS.name, filters=[("app_name", "=", APP_ID), ("batch_id", "=", 2)]
    ).to_pylist()
    assert [(n["org_id"], n["updated"], n["deleted"]) for n in notes] == [(org, second.rows_updated, 0)]


def test_expired_pending_and_malformed_requests_are_quarantined(spark, kafka, topic, mutation_topic, lake, checkpoints):
    records = produce_activities(kafka, topic, 20)
    ingest(spark, kafka, lake, checkpoints, topic)
    org = sorted({r["org_id"] for r in records.values()})[0]
    ghost = req("ghost", org, 1, "delete", field="lead_id", id="00QNEVER")
    first = mutate(spark, kafka, lake, checkpoints, mutation_topic, [ghost], horizon_batches=1)
    assert first.pending_added == 1

    malformed = {
        b"not json {": "malformed_record",
        json.dumps(
            req("m1", org, 2, "convert", from_field="lead_id", from_id="x", to_field="lead_id")
        ).encode(): "missing_required",
        json.dumps(req("m2", org, 2, "rename", field="lead_id", id="x")).encode(): "not_in_enum",
        json.dumps(req("m3", org, 2, "delete", field="owner_id", id="x")).encode(): "not_in_enum",
        json.dumps({**req("m4", org, 2, "merge", field="lead_id", from_ids="x", to_id="y")}).encode(): "wrong_type",
        json.dumps(
            req("m5", org, 2, "delete", field="lead_id", id="x", date_from="2026-02-01", date_to="2026-01-01")
        ).encode(): "invalid_date_range",
        json.dumps(
            {**req("m6", org, 2, "update", engagement_id="e1", record={"colour": "red"})}
        ).encode(): "wrong_type",
        json.dumps(
            {"request_id": "m7", "org_id": org, "op": "delete", "engagement_id": "e1", "request_time": "soon"}
        ).encode(): "wrong_type",
    }
    second = mutate(spark, kafka, lake, checkpoints, mutation_topic, list(malformed), horizon_batches=1)
    assert (second.requests_malformed, second.pending_expired, second.requests_applied) == (len(malformed), 1, 0)

    q = lake.read(QUARANTINE_ENGAGEMENT_MUTATIONS.name).to_pylist()
    expired = [r for r in q if r["error_code"] == TARGET_NOT_FOUND]
    assert len(expired) == 1 and "00QNEVER" in expired[0]["message"] and "1 batch" in expired[0]["message"]
    assert json.loads(expired[0]["input"])["request_id"] == "ghost" and expired[0]["batch_id"] == 2
    by_raw = {}
    for r in q:
        if r["error_code"] != TARGET_NOT_FOUND:
            by_raw.setdefault(r["raw"], set()).add(r["error_code"])
    assert set(by_raw) == set(malformed), "every malformed request quarantined with its raw bytes, none dropped"
    for raw, code in malformed.items():
        assert code in by_raw[raw], (raw, by_raw[raw])
    assert all(r["pipeline"] == "engagement_mutations" and r["message"] for r in q)
    assert lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).num_rows == 0
    assert lake.read(ENGAGEMENT_MUTATION_REQUESTS.name).column("request_id").to_pylist() == ["ghost"]


def ingested_org_with_a_lead(spark, kafka, topic, lake, checkpoints) -> tuple[str, str, list[dict], set[str]]:
    """40 activities ingested; (an org, one of its lead ids, the org's rows, the engagements on that lead)."""
    records = produce_activities(kafka, topic, 40)
    ingest(spark, kafka, lake, checkpoints, topic)
    org = sorted({r["org_id"] for r in records.values()})[0]
    lead = pick(records, org, "lead_id")[0]
    before = rows_of(lake, org)
    return org, lead, before, {r["engagement_id"] for r in before if r["lead_id"] == lead}


@pytest.mark.on_cluster
@pytest.mark.lake_stores("local", "s3")  # exactly-once on an object store too
@pytest.mark.parametrize(
    "crash_after",
    [
        DATA_FILES,
        ENGAGEMENT_MUTATION_REQUESTS.name,
        ENGAGEMENT_ACTIVITY.name,
        ENGAGEMENT_ACTIVITY_CHANGES.name,
        ENGAGEMENT_MUTATIONS_PENDING.name,
    ],
)
def test_process_killed_between_table_commits_then_rerun_applies_once(
    spark, kafka, topic, mutation_topic, lake, lake_root, checkpoints, crash_after
):
    """Killed after each commit, and after the executors wrote their files but before any commit: the re-run
    commits each table once, no file of the dead attempt stays behind, each change is logged once."""
    org, lead, before, lead_rows = ingested_org_with_a_lead(spark, kafka, topic, lake, checkpoints)
    requests = [
        req("r1", org, 1, "convert", from_field="lead_id", from_id=lead, to_field="lead_id", to_id="00QMID"),
        req("r2", org, 2, "convert", from_field="lead_id", from_id="00QMID", to_field="contact_id", to_id="003END"),
        req("r3", org, 3, "delete", field="lead_id", id="00QMISSING"),
        b"{broken",
    ]
    produce_requests(kafka, mutation_topic, requests)
    p = plan_mutations(kafka, checkpoints, mutation_topic)

    if crash_after == DATA_FILES:
        killed_at(STREAM, lake_root, p.batch_id, DATA_FILES)
        assert written_by_batch(lake, p.batch_id), "the executors had written files"
        assert projected(rows_of(lake, org)) == projected(before), "uncommitted files are invisible"
        rerun = finished(STREAM, lake_root, p.batch_id)
    else:
        rerun = crash_then_rerun(lake_root, lake, checkpoints, STREAM, APP_ID, p.batch_id, crash_after)
    meta = json.loads(rerun.stdout.strip().splitlines()[-1])
    assert (meta["requests_applied"], meta["pending_added"]) == (2, 1), (
        "the re-run reaches the first attempt's decisions"
    )

    after = rows_of(lake, org)
    assert {r["engagement_id"] for r in after if r["contact_id"] == "003END"} == lead_rows
    assert not [r for r in after if r["lead_id"] in (lead, "00QMID")]
    assert len(after) == len({r["engagement_id"] for r in after})
    history = [c for c in lake.table(ENGAGEMENT_ACTIVITY.name).history() if c.get("app_id") == APP_ID]
    assert len(history) == 1, "one commit of the batch's files"
    assert not [f for f in written_by_batch(lake, p.batch_id) if f in unreferenced_files(lake, ENGAGEMENT_ACTIVITY)], (
        "no orphan file"
    )
    logged = Counter(r["_change_type"] for r in lake.read(ENGAGEMENT_ACTIVITY_CHANGES.name).to_pylist())
    assert logged == {"update_preimage": len(lead_rows), "update_postimage": len(lead_rows)}, "each change logged once"
    assert sorted(lake.read(ENGAGEMENT_MUTATION_REQUESTS.name).column("request_id").to_pylist()) == ["r1", "r2", "r3"]
    assert lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).column("request_id").to_pylist() == ["r3"]
    q = lake.read(QUARANTINE_ENGAGEMENT_MUTATIONS.name)
    assert pc.count_distinct(q["row_id"]).as_py() == 1
    notes = lake.read(ENGAGEMENT_NOTIFICATIONS.name, filters=[("app_name", "=", APP_ID)]).to_pylist()
    assert [(n["org_id"], n["updated"], n["deleted"]) for n in notes] == [(org, len(lead_rows), 0)]


def written_by_batch(lake, batch_id: int) -> list[str]:
    """Data files in engagement_activity's folder named as written by this mutation batch (committed or not)."""
    tag = writer_tag(APP_ID, batch_id)
    fs, root = filesystem(lake.uri(ENGAGEMENT_ACTIVITY.name), lake.storage_options)  # a local folder or an object store
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return sorted(
        i.path[len(root) + 1 :]
        for i in infos
        if i.is_file and i.base_name.startswith(f"part-{tag}-") and i.base_name.endswith(".parquet")
    )


def test_pending_request_expires_after_the_age_horizon_measured_at_the_batch_as_of(
    spark, kafka, topic, mutation_topic, lake, checkpoints, monkeypatch
):
    """EP_MUTATION_PENDING_MAX_AGE_HOURS: a request pending longer than that (first_seen_at -> the batch's pinned
    as-of time) is quarantined with target_not_found_within_horizon naming the age horizon, before the batch horizon."""
    from engagement_platform.engagement.mutation.apply import pinned_as_of

    records = produce_activities(kafka, topic, 20)
    ingest(spark, kafka, lake, checkpoints, topic)
    org = sorted({r["org_id"] for r in records.values()})[0]
    first = mutate(
        spark, kafka, lake, checkpoints, mutation_topic, [req("old", org, 1, "delete", field="lead_id", id="00QNEVER")]
    )
    assert first.pending_added == 1
    (row,) = lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).to_pylist()
    assert row["first_seen_at"] == pinned_as_of(lake, 1), "the clock starts at the batch's recorded as-of time"

    monkeypatch.setenv("EP_MUTATION_PENDING_MAX_AGE_HOURS", "0.0001")  # 0.36 s: batch 2's as-of is later than that
    second = mutate(
        spark,
        kafka,
        lake,
        checkpoints,
        mutation_topic,
        [req("young", org, 2, "delete", field="lead_id", id="00QNEVER2")],
        horizon_batches=1,
    )
    assert (second.pending_expired, second.pending_added, second.pending_retained) == (1, 1, 0)
    (expired,) = [
        r for r in lake.read(QUARANTINE_ENGAGEMENT_MUTATIONS.name).to_pylist() if r["error_code"] == TARGET_NOT_FOUND
    ]
    assert json.loads(expired["input"])["request_id"] == "old" and "within the age horizon" in expired["message"]
    assert "0.0001 h after" in expired["message"] and "00QNEVER" in expired["message"]
    assert lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).column("request_id").to_pylist() == ["young"]

    # the batch horizon still applies, and the message says which one ran out
    monkeypatch.setenv("EP_MUTATION_PENDING_MAX_AGE_HOURS", "72")
    third = mutate(spark, kafka, lake, checkpoints, mutation_topic, [b"{"])
    assert third.pending_expired == 1
    messages = {
        json.loads(r["input"])["request_id"]: r["message"]
        for r in lake.read(QUARANTINE_ENGAGEMENT_MUTATIONS.name).to_pylist()
        if r["error_code"] == TARGET_NOT_FOUND
    }
    assert "within the batches horizon" in messages["young"]
    # the request log's outcome is per (org, request_id)
    log = {
        (r["org_id"], r["request_id"]): r["outcome"] for r in lake.read(ENGAGEMENT_MUTATION_REQUESTS.name).to_pylist()
    }
    assert log == {(org, "old"): "pending", (org, "young"): "pending"}


def test_one_task_and_many_tasks_give_the_same_tables(
    spark, kafka, topic, mutation_topic, lake, lake_root, checkpoints, tmp_path
):
    """The same batches on the same table with every org in one Spark task and with the orgs spread over
    four tasks: every table the batches write is the same, pending hold-back and retry included (the
    rules are per org, so how orgs are grouped into tasks must not matter)."""
    import shutil

    from engagement_platform.lake.checkpoints import CheckpointStore
    from engagement_platform.lake.delta import DeltaLake

    records = produce_activities(kafka, topic, 90)
    ingest(spark, kafka, lake, checkpoints, topic)
    shutil.copytree(lake_root, tmp_path / "spark-lake")
    spark_lake = DeltaLake(str(tmp_path / "spark-lake"))
    spark_checkpoints = CheckpointStore(spark_lake)
    orgs = sorted({r["org_id"] for r in records.values()})
    a, b, c = orgs[0], orgs[1], orgs[2]
    lead_a = pick(records, a, "lead_id", 2)
    c1, c2 = pick(records, b, "contact_id", 2)
    eng_c = sorted(e for e, r in records.items() if r["org_id"] == c)
    batches = [
        [
            req("a1", a, 1, "convert", from_field="lead_id", from_id=lead_a[0], to_field="contact_id", to_id="003A1"),
            req(
                "a2",
                a,
                2,
                "merge",
                field="contact_id",
                from_ids=["003A1", pick(records, a, "contact_id")[0]],
                to_id="003A2",
            ),
            req("a3", a, 3, "delete", field="lead_id", id=lead_a[1], date_from="2026-01-01", date_to="2026-12-31"),
            # a ghost target and a chain that needs it: both held back, in order
            req("a4", a, 4, "convert", from_field="lead_id", from_id="00QGHOST", to_field="lead_id", to_id="00QGHOST2"),
            req("a5", a, 5, "convert", from_field="lead_id", from_id="00QGHOST2", to_field="contact_id", to_id="003G"),
            req("b1", b, 1, "merge", field="contact_id", from_ids=[c1, c2], to_id="003B"),
            req("b2", b, 2, "convert", from_field="contact_id", from_id="003B", to_field="lead_id", to_id="00QB"),
            req(
                "c1",
                c,
                1,
                "update",
                engagement_id=eng_c[0],
                record={"contact_id": "003U", "engagement_date": "2026-02-03", "subject": "u"},
            ),
            req("c2", c, 2, "merge", field="contact_id", from_ids=["003U"], to_id="003V"),
            req("c3", c, 3, "delete", engagement_id=eng_c[1]),
            req("c4", c, 4, "update", engagement_id="e-missing", record={"subject": "never"}),
        ],
        [
            req("a6", a, 6, "convert", from_field="contact_id", from_id="003A2", to_field="lead_id", to_id="00QBACK"),
            req("b3", b, 3, "delete", field="lead_id", id="00QB"),
            req("c5", c, 5, "update", engagement_id=eng_c[2], record={"lead_id": "00QNEW", "subject": "again"}),
        ],
    ]

    def tables(on_lake) -> dict:
        out = {}
        for table, drop in (
            (ENGAGEMENT_ACTIVITY, ()),
            (ENGAGEMENT_MUTATION_REQUESTS, ("received_at",)),
            (ENGAGEMENT_MUTATIONS_PENDING, ("first_seen_at",)),
            (QUARANTINE_ENGAGEMENT_MUTATIONS, ("quarantined_at", "quarantine_date")),
            (ENGAGEMENT_NOTIFICATIONS, ("ingestion_hour", "last_modified_time")),
            (ENGAGEMENT_ACTIVITY_CHANGES, ()),
        ):
            if on_lake.exists(table.name):
                rows = [{k: v for k, v in r.items() if k not in drop} for r in on_lake.read(table.name).to_pylist()]
                out[table.name] = sorted(rows, key=repr)
        return out

    for requests in batches:
        produce_requests(kafka, mutation_topic, requests)
        marks = kafka.watermarks(mutation_topic)
        results = {}
        partitions = spark.conf.get("spark.sql.shuffle.partitions")
        for tasks, on_lake, store in (("1", lake, checkpoints), ("4", spark_lake, spark_checkpoints)):
            spark.conf.set("spark.sql.shuffle.partitions", tasks)
            try:
                p = plan_next_batch(STREAM, mutation_topic, store.latest_plan(STREAM), marks, 10_000)
                assert store.record_plan(p)
                results[tasks] = apply_mutation_batch(spark, on_lake, store, kafka.bootstrap_servers, p)
            finally:
                spark.conf.set("spark.sql.shuffle.partitions", partitions)
        driver, on_spark = results["1"], results["4"]
        keys = (
            "requests_applied",
            "actions",
            "rows_updated",
            "rows_replaced",
            "rows_deleted",
            "pending_added",
            "pending_retained",
        )
        assert {k: getattr(on_spark, k) for k in keys} == {k: getattr(driver, k) for k in keys}
        assert driver.requests_applied > 0 and driver.rows_updated + driver.rows_deleted + driver.rows_replaced > 0
        assert tables(spark_lake) == tables(lake)
    assert {r["request_id"] for r in lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).to_pylist()} == {"a4", "a5", "c4"}


def test_rerun_after_another_writer_replaced_the_batch_files_falls_back_to_a_merge(
    spark, kafka, topic, mutation_topic, lake, lake_root, checkpoints
):
    """Killed after the request log (the pin is recorded), then upkeep rewrites the org's files before the
    re-run: the tasks' files would replace files that are gone, so the re-run MERGEs the changed rows by key
    instead, logs nothing (the MERGE's change data feed is exact) and leaves no file of its own behind."""
    from engagement_platform.lake.change_log import logged_versions
    from engagement_platform.lake.changes import START, changes_since

    org, lead, before, lead_rows = ingested_org_with_a_lead(spark, kafka, topic, lake, checkpoints)
    produce_requests(
        kafka,
        mutation_topic,
        [req("r1", org, 1, "convert", from_field="lead_id", from_id=lead, to_field="contact_id", to_id="003FB")],
    )
    p = plan_mutations(kafka, checkpoints, mutation_topic)
    killed_at(STREAM, lake_root, p.batch_id, ENGAGEMENT_MUTATION_REQUESTS.name)
    lake.z_order(ENGAGEMENT_ACTIVITY.name, ["engagement_date"], partition_filters=[("org_id", "=", org)])

    rerun = finished(STREAM, lake_root, p.batch_id)
    assert json.loads(rerun.stdout.strip().splitlines()[-1])["activity_commit"] == "merge"
    after = rows_of(lake, org)
    assert {r["engagement_id"] for r in after if r["contact_id"] == "003FB"} == lead_rows
    assert len(after) == len(before) and not [r for r in after if r["lead_id"] == lead]
    version = lake.find_batch_commit(ENGAGEMENT_ACTIVITY.name, APP_ID, p.batch_id)
    assert version not in logged_versions(lake, ENGAGEMENT_ACTIVITY.name, version, version)
    assert not lake.read(ENGAGEMENT_ACTIVITY_CHANGES.name).num_rows
    changed = changes_since(lake, ENGAGEMENT_NOTIFICATIONS, ENGAGEMENT_ACTIVITY.name, org, START).rows.to_pylist()
    assert {r["engagement_id"] for r in changed if r["_commit_version"] == version} == lead_rows
    assert not [f for f in written_by_batch(lake, p.batch_id) if f in unreferenced_files(lake, ENGAGEMENT_ACTIVITY)], (
        "no orphan file"
    )
