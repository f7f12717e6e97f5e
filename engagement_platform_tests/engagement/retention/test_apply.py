"""The TTL / GDPR retention stream end to end on the real broker, Spark Connect and Delta tables: org
retention, subject erasure from every table (data, pending, request log, quarantines) and then from the
files (vacuum), malformed and repeated requests, a process killed after each commit, the Dagster asset
with its checks and the sensor's cadence; plus the pure logic (cut-off, content matching) with hypothesis."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context, materialize
from hypothesis import given
from hypothesis import strategies as st

from engagement_platform.engagement.integrity import audit_notifications
from engagement_platform.engagement.mutation import apply as mutations
from engagement_platform.engagement.mutation.tables import (
    ENGAGEMENT_MUTATION_REQUESTS,
    ENGAGEMENT_MUTATIONS_PENDING,
    QUARANTINE_ENGAGEMENT_MUTATIONS,
)
from engagement_platform.engagement.retention.apply import APP_ID, STREAM, apply_retention_batch
from engagement_platform.engagement.retention.assets import (
    engagement_retention,
    engagement_retention_sensor,
    retention_batches,
)
from engagement_platform.engagement.retention.erasure import ERASED_TABLES, VACUUMED_TABLES, subject_rows_remaining
from engagement_platform.engagement.retention.requests import (
    ERASURE,
    RETENTION,
    RetentionRequest,
    activity_predicate,
    activity_request,
    canonical_request,
    cutoff_date,
    log_predicate,
    mentions,
)
from engagement_platform.engagement.retention.tables import GDPR_AUDIT, QUARANTINE_ENGAGEMENT_GDPR
from engagement_platform.engagement.tables import (
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_NOTIFICATIONS,
    QUARANTINE_ENGAGEMENT_INGESTION,
)
from engagement_platform.engagement.upkeep.assets import engagement_layout_upkeep
from engagement_platform.lake.row_erasure import keyed_predicate
from engagement_platform.lake.suppression import subject_hash
from engagement_platform.orchestration.runs import STREAM_TAG
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource
from engagement_platform.settings import load_settings
from engagement_platform_tests.support.activities import ingest, rows_of
from engagement_platform_tests.support.crash import KILLED, after_commit, crash_then_rerun, run_batch
from engagement_platform_tests.support.erasure import ASKED, activity, gdpr, plan_retention, produce, retain
from engagement_platform_tests.support.mutations import mutate, plan_mutations, produce_requests

A, B = "00D000001", "00D000002"
SUBJECT, CONTACT = "00QERASE01", "003ERASE02"
SECRET = load_settings().erasure.secret


def audit_rows(lake) -> dict[str, dict]:
    return {r["request_id"]: r for r in lake.read(GDPR_AUDIT.name).to_pylist()}


def count(lake, name) -> int:
    return lake.table(name).to_pyarrow_dataset().count_rows() if lake.exists(name) else 0


# ---- retention ------------------------------------------------------------------------------------


def test_retention_deletes_only_the_old_rows_of_that_org(spark, kafka, topic, gdpr_topic, lake, checkpoints):
    days = [date(2025, 12, 1) + timedelta(days=7 * i) for i in range(10)]  # 2025-12-01 .. 2026-02-02
    produce(kafka, topic, [activity(f"{org[-1]}{i}", org, d) for org in (A, B) for i, d in enumerate(days)])
    ingest(spark, kafka, lake, checkpoints, topic)
    result = retain(spark, kafka, lake, checkpoints, gdpr_topic, [gdpr("t1", A, RETENTION, retention_days=30)])

    cutoff = date(2026, 1, 2)  # the request's day (2026-02-01) - 30 days; not the clock's
    old = [d for d in days if d < cutoff]
    assert sorted(r["engagement_date"] for r in rows_of(lake, A)) == [d for d in days if d >= cutoff]
    assert len(rows_of(lake, B)) == len(days), "other orgs keep everything"
    assert result.rows_removed[ENGAGEMENT_ACTIVITY.name] == len(old) and result.requests_applied == 1

    (row,) = audit_rows(lake).values()
    assert (row["kind"], row["retention_days"], row["cutoff_date"], row["rows_removed"], row["batch_id"]) == (
        RETENTION,
        30,
        cutoff,
        len(old),
        1,
    )
    assert json.loads(row["rows_removed_by_table"])[ENGAGEMENT_ACTIVITY.name] == len(old)
    assert row["completed_at"] >= row["received_at"] and row["source_offset"] == 0
    version = result.versions[ENGAGEMENT_ACTIVITY.name]
    notes = lake.read(ENGAGEMENT_NOTIFICATIONS.name, filters=[("app_name", "=", APP_ID)]).to_pylist()
    assert [(n["org_id"], n["deleted"], n["table_version"]) for n in notes] == [(A, len(old), version)]
    assert audit_notifications(lake, ENGAGEMENT_ACTIVITY.name, version, APP_ID, 1).orgs_mismatched == 0
    assert checkpoints.is_done(STREAM, 1)

    versions = {
        t: lake.table(t).version() for t in (ENGAGEMENT_ACTIVITY.name, GDPR_AUDIT.name, ENGAGEMENT_NOTIFICATIONS.name)
    }
    again = apply_retention_batch(spark, lake, checkpoints, kafka.bootstrap_servers, checkpoints.plan(STREAM, 1))
    assert set(again.versions.values()) == {None}, "a re-run of a committed batch writes nothing"
    assert {t: lake.table(t).version() for t in versions} == versions
    assert again.as_of == result.as_of, "the re-run computes against the pinned as-of time"


# ---- erasure ----------------------------------------------------------------------------------------


def erasure_world(spark, kafka, topic, mutation_topic, lake, checkpoints) -> None:
    """The subject in every table: activity rows (two orgs), quarantined records (with and without an org),
    a pending mutation request, its request-log row and a quarantined mutation request."""
    day = date(2026, 1, 10)
    produce(
        kafka,
        topic,
        [
            activity("a1", A, day, lead=SUBJECT),
            activity("a2", A, day, lead=SUBJECT),
            activity("a3", A, day, lead="00QKEEP"),
            activity("a4", A, day, contact=CONTACT),
            activity("b1", B, day, lead=SUBJECT),
            # bad records: a wrong type (org known), a truncated one (no org), a longer id that only contains SUBJECT
            {**activity("q1", A, day, lead=SUBJECT), "event_time": "yesterday"},
            json.dumps(activity("q2", A, day, lead=SUBJECT)).encode()[:-20],
            {**activity("q3", A, day, lead=SUBJECT + "X"), "event_time": "yesterday"},
        ],
    )
    ingest(spark, kafka, lake, checkpoints, topic)
    mutate(
        spark,
        kafka,
        lake,
        checkpoints,
        mutation_topic,
        [
            {
                "request_id": "m1",
                "org_id": A,
                "request_time": ASKED,
                "op": "convert",
                "from_field": "lead_id",
                "from_id": "00QNOTYET",
                "to_field": "contact_id",
                "to_id": SUBJECT,
            },  # pending: 00QNOTYET has not arrived
            {
                "request_id": "m2",
                "org_id": A,
                "request_time": ASKED,
                "op": "delete",
                "field": "lead_id",
                "id": "00QOTHER",
            },  # pending, kept
            {
                "request_id": "m3",
                "org_id": A,
                "request_time": ASKED,
                "op": "convert",
                "from_field": "lead_id",
                "from_id": SUBJECT,
            },  # malformed
        ],
    )


def files_mentioning(lake, table: str, subject: str, partition: str | None = None) -> list[str]:
    """Data and change-data parquet files of a table holding the subject (every string/binary cell)."""
    found = []
    for path in Path(lake.uri(table)).rglob("*.parquet"):
        if "_delta_log" in path.parts or (partition and partition not in str(path)):
            continue
        cells = pq.read_table(path).to_pylist()
        if any(mentions(v, subject) for row in cells for v in row.values() if isinstance(v, (str, bytes))):
            found.append(str(path))
    return found


def test_erasure_removes_the_subject_from_every_table_then_vacuum_removes_its_files(
    spark, kafka, topic, gdpr_topic, mutation_topic, lake, lake_root, checkpoints
):
    erasure_world(spark, kafka, topic, mutation_topic, lake, checkpoints)
    before = {t: count(lake, t) for t in ERASED_TABLES}
    assert sorted(lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).column("request_id").to_pylist()) == ["m1", "m2"]
    assert (
        lake.read(QUARANTINE_ENGAGEMENT_MUTATIONS.name).num_rows > 0
        and before[QUARANTINE_ENGAGEMENT_INGESTION.name] == 3
    )

    result = retain(
        spark,
        kafka,
        lake,
        checkpoints,
        gdpr_topic,
        [
            gdpr("e1", A, ERASURE, subject_id=SUBJECT),
            gdpr("e2", A, ERASURE, subject_id=CONTACT, at="2026-02-01T11:00:00Z"),
        ],
    )

    assert sorted(r["engagement_id"] for r in rows_of(lake, A)) == ["a3"]
    assert [r["engagement_id"] for r in rows_of(lake, B)] == ["b1"], "the same id in another org is another person"
    assert sorted(lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).column("request_id").to_pylist()) == ["m2"]
    assert sorted(lake.read(ENGAGEMENT_MUTATION_REQUESTS.name).column("request_id").to_pylist()) == ["m2"]
    assert lake.read(QUARANTINE_ENGAGEMENT_MUTATIONS.name).num_rows == 0
    kept = lake.read(QUARANTINE_ENGAGEMENT_INGESTION.name)
    assert {json.loads(i)["engagement_id"] for i in kept["input"].to_pylist()} == {"q3"}, (
        "a longer id containing the subject is not the subject"
    )
    assert subject_rows_remaining(lake, result.erasures, SECRET) == {t: 0 for t in VACUUMED_TABLES}

    after = {t: count(lake, t) for t in ERASED_TABLES}
    audit = audit_rows(lake)
    assert set(audit) == {"e1", "e2"} and {a["kind"] for a in audit.values()} == {ERASURE}
    per_table = {t: sum(json.loads(a["rows_removed_by_table"])[t] for a in audit.values()) for t in ERASED_TABLES}
    assert per_table == {t: before[t] - after[t] for t in ERASED_TABLES} == result.rows_removed
    e1, e2 = (json.loads(audit[r]["rows_removed_by_table"]) for r in ("e1", "e2"))
    assert e1[ENGAGEMENT_ACTIVITY.name] == 2 and e2[ENGAGEMENT_ACTIVITY.name] == 1
    assert (
        e1[QUARANTINE_ENGAGEMENT_INGESTION.name],
        e1[ENGAGEMENT_MUTATIONS_PENDING.name],
        e1[ENGAGEMENT_MUTATION_REQUESTS.name],
    ) == (2, 1, 1)
    assert e1[QUARANTINE_ENGAGEMENT_MUTATIONS.name] == before[QUARANTINE_ENGAGEMENT_MUTATIONS.name] > 0
    assert audit["e1"]["subject_hash"] == subject_hash(SECRET, A, SUBJECT) and audit["e1"]["rows_removed"] == sum(
        e1.values()
    )
    assert SUBJECT not in json.dumps(list(audit.values()), default=str), "the audit keeps the hash, never the id"
    notes = lake.read(ENGAGEMENT_NOTIFICATIONS.name, filters=[("app_name", "=", APP_ID)]).to_pylist()
    assert [(n["org_id"], n["deleted"]) for n in notes] == [(A, 3)]

    # Deletes only tombstone files: the subject's rows are still in data and change-data files until vacuum.
    assert files_mentioning(lake, ENGAGEMENT_ACTIVITY.name, SUBJECT, f"org_id={A}")
    out = materialize(
        [engagement_layout_upkeep],
        resources={"lake": LakeResource(root=lake_root)},
        run_config={"ops": {"engagement_layout_upkeep": {"config": {"vacuum_retention_hours": 0}}}},
    )
    assert out.success
    assert not files_mentioning(lake, ENGAGEMENT_ACTIVITY.name, SUBJECT, f"org_id={A}")
    for table in ERASED_TABLES[1:]:
        assert not files_mentioning(lake, table, SUBJECT), table
    assert files_mentioning(lake, ENGAGEMENT_ACTIVITY.name, SUBJECT, f"org_id={B}"), "the other org's row stays"

    # A second erasure reads files the first one's deletes rewrote (strings stored as string_view there).
    again = retain(
        spark,
        kafka,
        lake,
        checkpoints,
        gdpr_topic,
        [gdpr("e3", A, ERASURE, subject_id=CONTACT, at="2026-02-01T12:00:00Z")],
    )
    assert again.requests_applied == 1 and sum(again.rows_removed.values()) == 0


# ---- malformed and repeated requests ---------------------------------------------------------------


def test_malformed_and_repeated_requests_are_quarantined_with_reasons(
    spark, kafka, topic, gdpr_topic, lake, checkpoints
):
    produce(kafka, topic, [activity("a1", A, date(2025, 1, 1))])
    ingest(spark, kafka, lake, checkpoints, topic)
    first = retain(spark, kafka, lake, checkpoints, gdpr_topic, [gdpr("ok", A, RETENTION, retention_days=10)])
    assert first.requests_applied == 1 and not rows_of(lake, A)

    future = (datetime.now(UTC) + timedelta(days=3)).isoformat().replace("+00:00", "Z")
    malformed = {
        b"{not json": "malformed_record",
        json.dumps(gdpr("m1", A, ERASURE)).encode(): "missing_required",
        json.dumps(gdpr("m2", A, "forget")).encode(): "not_in_enum",
        json.dumps(gdpr("m3", A, RETENTION, retention_days=0)).encode(): "out_of_range",
        json.dumps(gdpr("m4", A, RETENTION, retention_days="ten")).encode(): "wrong_type",
        json.dumps(gdpr("m5", A, ERASURE, subject_id="x", retention_days=5)).encode(): "unexpected_field",
        json.dumps(gdpr("m6", A, RETENTION, at=future, retention_days=5)).encode(): "request_time_in_future",
        json.dumps(gdpr("ok", A, RETENTION, retention_days=10)).encode(): "duplicate_request",
    }
    second = retain(
        spark,
        kafka,
        lake,
        checkpoints,
        gdpr_topic,
        [*malformed, gdpr("d", A, ERASURE, subject_id="y"), gdpr("d", A, ERASURE, subject_id="z")],
    )
    assert (second.requests_read, second.requests_applied, second.requests_quarantined) == (
        len(malformed) + 2,
        1,
        len(malformed) + 1,
    )

    q = lake.read(QUARANTINE_ENGAGEMENT_GDPR.name, filters=[("batch_id", "=", 2)]).to_pylist()
    by_raw: dict[bytes, set[str]] = {}
    for r in q:
        by_raw.setdefault(r["raw"], set()).add(r["error_code"])
        assert (
            r["pipeline"] == "engagement_gdpr"
            and r["message"]
            and r["source_offset"] is not None
            and r["row_id"].startswith(gdpr_topic)
        )
    for raw, code in malformed.items():
        assert code in by_raw[raw], (raw, by_raw.get(raw))
    assert {"duplicate_in_batch"} in by_raw.values(), "the second request 'd' of the batch"
    assert sorted(audit_rows(lake)) == ["d", "ok"]


# ---- crash after each commit -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "crash_after",
    [
        QUARANTINE_ENGAGEMENT_GDPR.name,
        ENGAGEMENT_ACTIVITY.name,
        QUARANTINE_ENGAGEMENT_INGESTION.name,
        ENGAGEMENT_NOTIFICATIONS.name,
    ],
)
@pytest.mark.lake_stores("local", "s3")  # exactly-once on an object store too
def test_process_killed_after_a_commit_then_rerun_applies_once(
    spark, kafka, topic, gdpr_topic, lake, lake_root, checkpoints, crash_after
):
    day = date(2025, 6, 1)
    produce(
        kafka,
        topic,
        [
            activity("a1", A, day, lead=SUBJECT),
            activity("a2", A, date(2026, 1, 30), contact=CONTACT),
            activity("a3", A, date(2026, 1, 31)),
            {**activity("q1", A, day, lead=SUBJECT), "event_time": "yesterday"},
        ],
    )
    ingest(spark, kafka, lake, checkpoints, topic)
    produce(
        kafka,
        gdpr_topic,
        [gdpr("e1", A, ERASURE, subject_id=SUBJECT), gdpr("t1", A, RETENTION, retention_days=30), b"{broken"],
    )
    p = plan_retention(kafka, checkpoints, gdpr_topic)

    rerun = crash_then_rerun(lake_root, lake, checkpoints, STREAM, APP_ID, p.batch_id, crash_after)
    meta = json.loads(rerun.stdout.strip().splitlines()[-1])
    assert (meta["requests_applied"], meta["requests_quarantined"]) == (2, 1)

    assert sorted(r["engagement_id"] for r in rows_of(lake, A)) == ["a2", "a3"]
    assert len([c for c in lake.table(ENGAGEMENT_ACTIVITY.name).history() if c.get("app_id") == APP_ID]) == 1, (
        "one delete commit"
    )
    audit = audit_rows(lake)
    assert sorted(audit) == ["e1", "t1"], "one audit row per request"
    assert (
        json.loads(audit["e1"]["rows_removed_by_table"])[ENGAGEMENT_ACTIVITY.name] == 1
    )  # a1 (the older request takes it)
    assert json.loads(audit["e1"]["rows_removed_by_table"])[QUARANTINE_ENGAGEMENT_INGESTION.name] >= 1
    assert json.loads(audit["t1"]["rows_removed_by_table"])[ENGAGEMENT_ACTIVITY.name] == 0
    assert lake.read(QUARANTINE_ENGAGEMENT_INGESTION.name).num_rows == 0
    q = lake.read(QUARANTINE_ENGAGEMENT_GDPR.name)
    assert pc.count_distinct(q["row_id"]).as_py() == 1
    notes = lake.read(ENGAGEMENT_NOTIFICATIONS.name, filters=[("app_name", "=", APP_ID)]).to_pylist()
    assert [(n["org_id"], n["deleted"]) for n in notes] == [(A, 1)]


# ---- Dagster: sensor plans on its cadence, the asset applies with its checks ---------------------------


def test_sensor_plans_on_its_cadence_and_the_asset_applies_with_checks(
    spark, kafka, topic, gdpr_topic, lake, lake_root, checkpoints, stack, monkeypatch
):
    monkeypatch.setenv("EP_GDPR_TOPIC", gdpr_topic)
    monkeypatch.delenv("EP_RETENTION_INTERVAL_SECONDS", raising=False)
    produce(
        kafka,
        topic,
        [activity("a1", A, date(2026, 1, 10), lead=SUBJECT), activity("a2", A, date(2026, 1, 10), lead="00QKEEP")],
    )
    ingest(spark, kafka, lake, checkpoints, topic)
    produce(kafka, gdpr_topic, [gdpr("e1", A, ERASURE, subject_id=SUBJECT), b"not json"])
    resources = {
        "kafka": KafkaResource(bootstrap_servers=stack["KAFKA_BOOTSTRAP_SERVERS"]),
        "lake": LakeResource(root=lake_root),
        "coordinator": CoordinatorResource(lake=LakeResource(root=lake_root)),
    }

    def tick(instance):
        with build_sensor_context(instance=instance, resources=resources) as ctx:
            return engagement_retention_sensor(ctx)

    with DagsterInstance.ephemeral() as instance:
        result = tick(instance)
        assert isinstance(result, SensorResult)
        (request,) = result.run_requests
        assert request.tags[STREAM_TAG] == STREAM and gdpr_topic in request.run_key
        assert result.asset_events[0].asset_key.to_user_string() == "kafka/engagement_gdpr"

        instance.add_dynamic_partitions(retention_batches.name, [request.partition_key])
        out = materialize(
            [engagement_retention],
            partition_key=request.partition_key,
            instance=instance,
            tags=request.tags,
            resources={**resources, "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]})},
        )
        assert out.success
        checks = {e.check_name: e for e in out.get_asset_check_evaluations()}
        assert set(checks) == {
            "subject_erased_everywhere",
            "notifications_match_changes",
            "offset_ranges_contiguous",
            "requests_accounted",
        }
        assert all(c.passed for c in checks.values()), {n: c.metadata for n, c in checks.items()}
        erased = checks["subject_erased_everywhere"].metadata
        assert (
            erased["erasures_in_batch"].value == erased["subjects_suppressed"].value == 1
            and erased["rows_remaining"].value == 0
        )
        assert erased[f"rows_remaining_{ENGAGEMENT_ACTIVITY.name}"].value == 0
        accounted = checks["requests_accounted"].metadata
        assert (
            accounted["requests_read"].value,
            accounted["requests_applied"].value,
            accounted["requests_quarantined"].value,
        ) == (2, 1, 1)
        assert [r["engagement_id"] for r in rows_of(lake, A)] == ["a2"]
        materialized = {
            m.asset_key.to_user_string() for m in out.asset_materializations_for_node("engagement_retention")
        }
        assert {
            "engagement_retention",
            "engagement_activity",
            "gdpr_audit",
            "quarantine_engagement_gdpr",
        } <= materialized

        # daily cadence: the next request waits for the interval, then is planned
        produce(kafka, gdpr_topic, [gdpr("e2", A, ERASURE, subject_id="00QKEEP")])
        waiting = tick(instance)
        assert isinstance(waiting, SkipReason) and "due in" in waiting.skip_message
        monkeypatch.setenv("EP_RETENTION_INTERVAL_SECONDS", "0")
        (second,) = tick(instance).run_requests
        assert second.partition_key == "00000002"


# ---- pure logic ------------------------------------------------------------------------------------


AT = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2090, 1, 1), timezones=st.just(UTC))


@given(AT, st.integers(1, 36500), st.dates(min_value=date(1950, 1, 1), max_value=date(2100, 1, 1)))
def test_retention_removes_exactly_the_rows_older_than_n_days_at_the_request_day(at, days, day):
    r = RetentionRequest("r", A, at, RETENTION, retention_days=days)
    assert r.cutoff == cutoff_date(at, days) == at.date() - timedelta(days=days)
    removed = activity_request({"org_id": A, "engagement_date": day}, [r]) is not None
    assert removed == ((at.date() - day).days > days)
    assert activity_request({"org_id": B, "engagement_date": day}, [r]) is None
    assert activity_request({"org_id": A, "engagement_date": None}, [r]) is None


@given(at=AT, offset=st.integers(-48 * 3600, 48 * 3600))
def test_request_time_is_fixed_by_the_request_and_future_times_are_refused(at, offset):
    as_of = at + timedelta(seconds=offset)
    row = {
        "request_id": "r",
        "org_id": A,
        "request_time": at.replace(tzinfo=None),
        "kind": RETENTION,
        "retention_days": 5,
    }
    request, errors = canonical_request(row, as_of)
    if at > as_of + timedelta(days=1):
        assert request is None and [e["error_code"] for e in errors] == ["request_time_in_future"]
    else:
        assert errors == [] and request.cutoff == at.date() - timedelta(days=5)


TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_", min_size=1, max_size=12)


SUBJECT_IDS = TOKEN.filter(lambda t: t not in ("null", "true", "false"))  # JSON's literals are tokens, never ids


@given(st.lists(TOKEN, max_size=8), SUBJECT_IDS, st.booleans(), st.integers(0, 8))
def test_mentions_finds_the_id_as_a_whole_token_in_json_text_and_bytes(tokens, subject, include, position):
    values = list(tokens)
    if include:
        values.insert(min(position, len(values)), subject)
    text = json.dumps({"lead_id": values[0] if values else None, "others": values[1:]})
    expected = subject in values
    assert mentions(text, subject) == expected
    assert mentions(text.encode(), subject) == expected
    half = len(text) // 2  # truncated bytes (a record that does not parse) are searched the same way
    assert mentions(text.encode()[:half], subject) == mentions(text[:half], subject)


def test_predicates_group_by_partition_and_quote_values():
    requests = [
        RetentionRequest("r1", A, datetime(2026, 2, 1, tzinfo=UTC), RETENTION, retention_days=30),
        RetentionRequest("r2", A, datetime(2026, 2, 1, tzinfo=UTC), ERASURE, subject_id="O'Brien"),
        RetentionRequest("r3", B, datetime(2026, 2, 3, tzinfo=UTC), RETENTION, retention_days=1),
    ]
    assert activity_predicate(requests, {A: {"e'1", "e2"}, "C": {"e3"}}) == (
        f"(org_id = '{A}' AND (engagement_date < CAST('2026-01-02' AS DATE) OR engagement_id IN ('e''1', 'e2')))"
        f" OR (org_id = '{B}' AND (engagement_date < CAST('2026-02-02' AS DATE)))"
        " OR (org_id = 'C' AND (engagement_id IN ('e3')))"
    ), "an erasure names rows by key, never the subject id"
    assert "O''Brien" not in activity_predicate(requests)
    assert log_predicate([{"org_id": A, "_commit_version": 3, "_change_type": "delete", "engagement_id": "e1"}]) == (
        f"(org_id = '{A}' AND _commit_version = 3 AND _change_type = 'delete' AND engagement_id IN ('e1'))"
    )
    assert activity_predicate([]) is None
    assert (
        keyed_predicate(("pipeline", "row_id"), {("p", "t:0:2"), ("p", "t:0:1")})
        == "(pipeline = 'p' AND row_id IN ('t:0:1', 't:0:2'))"
    )
    assert mutations.STREAM != STREAM  # each stream its own txn app id and checkpoint partition


# ---- an erasure between a crashed mutation batch and its re-run ------------------------------------


def test_mutation_rerun_after_an_erasure_does_not_bring_back_erased_pending_requests(
    spark, kafka, topic, gdpr_topic, mutation_topic, lake, lake_root, checkpoints
):
    """The mutation batch re-runs against its pinned pending version; an erasure committed after the pin
    must stay done: neither the carried pending request nor the batch's new one comes back."""
    produce(kafka, topic, [activity("a1", A, date(2026, 1, 10), lead="00QKEEP")])
    ingest(spark, kafka, lake, checkpoints, topic)

    def pending(rid, missing, **to) -> dict:
        return {
            "request_id": rid,
            "org_id": A,
            "request_time": ASKED,
            "op": "convert",
            "from_field": "lead_id",
            "from_id": missing,
            "to_field": "contact_id",
            "to_id": to.get("to_id", "003KEPT"),
        }

    mutate(
        spark,
        kafka,
        lake,
        checkpoints,
        mutation_topic,
        [pending("m1", "00QNOTYET", to_id=SUBJECT), pending("m2", "00QOTHER")],
    )
    produce_requests(kafka, mutation_topic, [pending("m3", "00QNOTYET2", to_id=SUBJECT), pending("m4", "00QOTHER2")])
    p = plan_mutations(kafka, checkpoints, mutation_topic)
    crashed = run_batch(
        mutations.STREAM,
        lake_root,
        p.batch_id,
        failpoint=after_commit(mutations.STREAM, ENGAGEMENT_MUTATION_REQUESTS.name),
    )
    assert crashed.returncode == KILLED, crashed.stderr[-2000:]

    result = retain(spark, kafka, lake, checkpoints, gdpr_topic, [gdpr("e1", A, ERASURE, subject_id=SUBJECT)])
    assert lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).column("request_id").to_pylist() == ["m2"]
    assert sorted(lake.read(ENGAGEMENT_MUTATION_REQUESTS.name).column("request_id").to_pylist()) == ["m2", "m4"]

    rerun = run_batch(mutations.STREAM, lake_root, p.batch_id)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert checkpoints.is_done(mutations.STREAM, p.batch_id)
    assert sorted(lake.read(ENGAGEMENT_MUTATIONS_PENDING.name).column("request_id").to_pylist()) == ["m2", "m4"]
    assert subject_rows_remaining(lake, result.erasures, SECRET) == {t: 0 for t in VACUUMED_TABLES}
    q = lake.read(QUARANTINE_ENGAGEMENT_MUTATIONS.name) if lake.exists(QUARANTINE_ENGAGEMENT_MUTATIONS.name) else None
    assert q is None or not any(mentions(v, SUBJECT) for v in q["input"].to_pylist() if v)
    # the re-run is still exactly-once: one pending commit for the batch, the same decisions
    commits = [
        c for c in lake.table(ENGAGEMENT_MUTATIONS_PENDING.name).history() if c.get("app_id") == mutations.APP_ID
    ]
    assert sorted(c["batch_id"] for c in commits) == ["1", "2"]
    meta = json.loads(rerun.stdout.strip().splitlines()[-1])
    # m3 (into the erased id) is now dropped by the suppression list the re-run reads (the latest one)
    assert (meta["requests_applied"], meta["pending_retained"], meta["pending_added"], meta["requests_suppressed"]) == (
        0,
        2,
        1,
        1,
    )
