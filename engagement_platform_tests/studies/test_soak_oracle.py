"""The soak benchmark's oracle (benchmarks/soak/oracle.py) on tiny hand-made workloads with hand-computed answers,
and the soak workload checked against it. Pure: no stack, no Spark."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from datetime import UTC, date, datetime

import pyarrow as pa

from benchmarks.soak.oracle import CHECKED, DUPLICATE, EXPIRED, expected
from benchmarks.soak.workload import (
    ACTIVITIES,
    BAD_MEMBERS,
    BAD_PROFILE_ERASURES,
    GDPR,
    INGESTION,
    LANDING,
    MUTATIONS,
    ORGS,
    PROFILE_CDC,
    PROFILE_ERASURE,
    PROFILE_ERASURES,
    PROFILES,
    RETENTION,
    TENANTS,
    Gate,
    LandingFile,
    Message,
    Workload,
)

NOW = datetime(2026, 6, 1, tzinfo=UTC)
RETENTION_INTENTS = {
    "old_activity",
    "old_duplicate",
    "retention",
    "retention_duplicate",
}  # Workload._retention's messages
# Workload._profile_erasure's messages (and its bad requests, on a topic of their own)
PROFILE_ERASURE_INTENTS = {
    "profile_namesake",
    "erased_profile",
    "erased_profile_bad",
    "profile_erasure",
    "profile_erasure_duplicate",
    "after_profile_erasure",
    "after_profile_erasure_bad",
}


def added_later(m: Message) -> bool:
    """A message of the features added after the seed-7 digest below: retention, profile erasure."""
    return m.intent in RETENTION_INTENTS | PROFILE_ERASURE_INTENTS or m.topic == PROFILE_ERASURES


class Script:
    """Messages in send order; mutation messages and retention requests gated on the ingestion of earlier rounds, as
    the workload does."""

    def __init__(self):
        self.messages: list[Message] = []

    def send(self, topic: str, record, round: int = 0, gate: Gate | None = None, key: bytes = b"k") -> Script:
        value = record if isinstance(record, bytes) else json.dumps(record).encode()
        if gate is None and (topic == MUTATIONS or (isinstance(record, dict) and record.get("kind") == "retention")):
            gate = Gate(INGESTION, ACTIVITIES, round - 1)
        self.messages.append(Message(len(self.messages), round, topic, key, value, "test", gate))
        return self


def activity(eid: str, org: str = "o1", **columns) -> dict:
    return {
        "engagement_id": eid,
        "org_id": org,
        "activity_type": "call",
        "event_time": "2026-01-02T10:00:00Z",
        **columns,
    }


def request(rid: str, op: str, second: int, org: str = "o1", **columns) -> dict:
    return {"request_id": rid, "org_id": org, "request_time": f"2026-01-05T08:00:{second:02d}Z", "op": op, **columns}


def row(
    org="o1",
    lead_id=None,
    contact_id=None,
    account_id=None,
    user_id=None,
    engagement_date=date(2026, 1, 2),
    activity_type="call",
    subject=None,
) -> dict:
    return {
        "org_id": org,
        "lead_id": lead_id,
        "contact_id": contact_id,
        "account_id": account_id,
        "user_id": user_id,
        "engagement_date": engagement_date,
        "activity_type": activity_type,
        "subject": subject,
    }


def test_each_bad_activity_gets_the_reason_the_pipeline_gives_and_good_ones_their_utc_day():
    good = activity("a", event_time="2026-03-04T23:30:00-05:00", lead_id="L1", subject="hi")
    s = Script().send(ACTIVITIES, good)
    s.send(ACTIVITIES, json.dumps(activity("b")).encode()[:-7])
    s.send(ACTIVITIES, b"[1, 2, 3]")
    s.send(ACTIVITIES, {k: v for k, v in activity("c").items() if k != "activity_type"})
    s.send(ACTIVITIES, activity("d", duration_seconds="long"))
    s.send(ACTIVITIES, activity("e", activity_type="fax_sent"))
    s.send(ACTIVITIES, activity("f", payload={"body": "x" * 70_000}))
    s.send(ACTIVITIES, activity(" ", activity_type="fax"))  # a blank id and a bad type: both reasons, one record
    out = expected(s.messages, now=NOW)
    assert out.activities == {("o1", "a"): row(lead_id="L1", subject="hi", engagement_date=date(2026, 3, 5))}
    assert out.quarantine[ACTIVITIES] == Counter(
        {
            "malformed_record": 2,
            "missing_required": 1,
            "wrong_type": 1,
            "not_in_enum": 1,
            "oversized": 1,
            "missing_required+not_in_enum": 1,
        }
    )
    assert out.problems == []


def test_a_retried_activity_counts_once_as_a_duplicate_and_the_same_id_in_another_org_is_another_row():
    s = Script().send(ACTIVITIES, activity("a", lead_id="L1")).send(ACTIVITIES, activity("a", lead_id="L1"))
    s.send(ACTIVITIES, activity("a", org="o2"), round=1)
    out = expected(s.messages, now=NOW)
    assert set(out.activities) == {("o1", "a"), ("o2", "a")}
    assert out.quarantine[ACTIVITIES] == Counter({DUPLICATE: 1})


def test_requests_apply_one_by_one_in_request_time_order_whatever_the_send_order():
    s = Script().send(ACTIVITIES, activity("a", lead_id="L1")).send(ACTIVITIES, activity("b", lead_id="L1"))
    s.send(
        ACTIVITIES,
        activity(
            "c",
            contact_id="C1",
            account_id="AC1",
            activity_type="email_sent",
            subject="hi",
            event_time="2026-01-04T09:00:00Z",
        ),
    )
    s.send(MUTATIONS, request("r3", "delete", 3, engagement_id="b"), round=1)
    s.send(
        MUTATIONS,
        request("r1", "convert", 1, from_field="lead_id", from_id="L1", to_field="contact_id", to_id="C2"),
        round=1,
    )
    s.send(MUTATIONS, request("r2", "merge", 2, field="contact_id", from_ids=["C2", "C1"], to_id="C3"), round=1)
    s.send(
        MUTATIONS,
        request(
            "r4",
            "update",
            4,
            engagement_id="a",
            record={"contact_id": "C9", "engagement_date": "2026-02-01", "subject": "new"},
        ),
        round=1,
    )
    # same request_time: the request_id breaks the tie ("y" before "z"), so "z" wins
    s.send(
        MUTATIONS,
        request("z", "update", 5, engagement_id="c", record={"contact_id": "CZ", "activity_type": "meeting"}),
        round=1,
    )
    s.send(MUTATIONS, request("y", "update", 5, engagement_id="c", record={"contact_id": "CY"}), round=1)
    out = expected(s.messages, now=NOW)
    assert out.activities == {
        ("o1", "a"): row(
            contact_id="C9", engagement_date=date(2026, 2, 1), subject="new"
        ),  # the update replaced owners and date
        ("o1", "c"): row(contact_id="CZ", engagement_date=None, activity_type="meeting", subject="hi"),
    }
    assert out.requests == {("o1", r) for r in ("r1", "r2", "r3", "r4", "y", "z")}
    assert out.problems == [] and out.late == set()


def test_a_date_range_limits_a_convert_to_the_rows_it_holds():
    s = Script().send(ACTIVITIES, activity("a", lead_id="L1", event_time="2026-01-02T10:00:00Z"))
    s.send(ACTIVITIES, activity("b", lead_id="L1", event_time="2026-01-09T10:00:00Z"))
    s.send(
        MUTATIONS,
        request(
            "r1",
            "convert",
            1,
            from_field="lead_id",
            from_id="L1",
            to_field="contact_id",
            to_id="C2",
            date_from="2026-01-01",
            date_to="2026-01-03",
        ),
        round=1,
    )
    out = expected(s.messages, now=NOW)
    assert out.activities[("o1", "a")]["contact_id"] == "C2" and out.activities[("o1", "a")]["lead_id"] is None
    assert out.activities[("o1", "b")]["lead_id"] == "L1"


def test_bad_and_retried_requests_are_counted_by_reason():
    s = Script().send(ACTIVITIES, activity("a", lead_id="L1"))
    convert = request("r1", "convert", 1, from_field="lead_id", from_id="L1", to_field="contact_id", to_id="C2")
    s.send(MUTATIONS, convert, round=1).send(MUTATIONS, convert, round=1)
    s.send(MUTATIONS, json.dumps(request("r2", "delete", 2, engagement_id="a")).encode()[:-7], round=1)
    s.send(MUTATIONS, request("r3", "rename", 3), round=1)
    s.send(MUTATIONS, {k: v for k, v in convert.items() if k != "to_id"} | {"request_id": "r4"}, round=1)
    s.send(MUTATIONS, {**convert, "request_id": "r5", "date_from": "2026-01-20", "date_to": "2026-01-10"}, round=1)
    s.send(MUTATIONS, request("r6", "merge", 6, field="contact_id", from_ids="C1", to_id="C3"), round=1)
    s.send(MUTATIONS, request("r7", "delete", 7, engagement_id="a", field="lead_id", id="L1"), round=1)
    out = expected(s.messages, now=NOW)
    assert out.quarantine[MUTATIONS] == Counter(
        {
            DUPLICATE: 1,
            "malformed_record": 1,
            "not_in_enum": 1,
            "missing_required": 1,
            "invalid_date_range": 1,
            "wrong_type": 1,
            "ambiguous_target": 1,
        }
    )
    assert out.requests == {("o1", "r1")}


def test_a_late_target_may_expire_and_the_table_follows_what_actually_happened():
    s = Script().send(ACTIVITIES, activity("a", lead_id="L1"))
    s.send(MUTATIONS, request("early", "delete", 1, engagement_id="a"), round=1)
    s.send(
        MUTATIONS,
        request("late", "convert", 2, from_field="lead_id", from_id="L9", to_field="contact_id", to_id="C9"),
        round=1,
    )
    s.send(ACTIVITIES, activity("z", lead_id="L9"), round=3)  # the late request's target arrives two rounds later
    applied = expected(s.messages, now=NOW)
    assert applied.late == {("o1", "late")} and applied.problems == []
    assert applied.activities == {("o1", "z"): row(contact_id="C9")}

    expired = expected(s.messages, expired={("o1", "late")}, now=NOW)
    assert expired.activities == {("o1", "z"): row(lead_id="L9")}
    assert expired.quarantine[MUTATIONS] == Counter({EXPIRED: 1}) and expired.problems == []

    pending = expected(s.messages, pending={("o1", "late")}, now=NOW)
    assert pending.activities == expired.activities and len(pending.unaccounted) == 1

    wrongly = expected(s.messages, expired={("o1", "early")}, now=NOW)  # its target was committed before it was sent
    assert any("expired although" in p for p in wrongly.problems)


def test_a_request_whose_target_the_broker_lost_expires_without_breaking_an_assumption():
    """Soak seed 59: the broker lost a late target's message, so its request could only expire; the oracle, which
    sees what the topics hold, took that expiry for a broken workload assumption."""
    s = Script().send(ACTIVITIES, activity("a", lead_id="L1"))
    s.send(MUTATIONS, request("orphan", "update", 1, engagement_id="lost", record={"subject": "x"}), round=1)
    out = expected(s.messages, expired={("o1", "orphan")}, now=NOW)
    assert out.late == {("o1", "orphan")} and out.problems == []
    assert out.quarantine[MUTATIONS] == Counter({EXPIRED: 1}) and out.activities == {("o1", "a"): row(lead_id="L1")}


def test_requests_whose_targets_were_only_in_activities_the_broker_lost_may_expire_or_change_nothing():
    """Soak seed 61: the workload chose a convert's date range around a row whose message the broker lost, and
    another convert of the same lead (no range) after a first one had taken its only row on the topic. The lake
    expired the first and applied the second in the batch that converted the row, changing nothing; a merge of a
    contact the lost activity named expired too. All three are accepted, and the table is what happened."""
    s = Script().send(ACTIVITIES, activity("a", lead_id="L1", event_time="2026-01-23T10:00:00Z"))
    lost = (
        Script()
        .send(ACTIVITIES, activity("gone", lead_id="L1", contact_id="C9", event_time="2026-01-05T10:00:00Z"))
        .messages
    )
    s.send(ACTIVITIES, activity("b", contact_id="C8"))
    s.send(
        MUTATIONS,
        request(
            "ranged",
            "convert",
            1,
            from_field="lead_id",
            from_id="L1",
            to_field="contact_id",
            to_id="C1",
            date_from="2026-01-04",
            date_to="2026-01-06",
        ),
        round=1,
    )
    s.send(
        MUTATIONS,
        request(
            "first",
            "convert",
            2,
            from_field="lead_id",
            from_id="L1",
            to_field="contact_id",
            to_id="C2",
            date_from="2026-01-22",
            date_to="2026-01-25",
        ),
        round=1,
    )
    s.send(
        MUTATIONS,
        request("rest", "convert", 3, from_field="lead_id", from_id="L1", to_field="contact_id", to_id="C3"),
        round=1,
    )
    s.send(MUTATIONS, request("merge", "merge", 4, field="contact_id", from_ids=["C8", "C9"], to_id="C7"), round=1)
    out = expected(s.messages, expired={("o1", "ranged"), ("o1", "merge")}, now=NOW, lost=lost)
    assert out.problems == [] and {("o1", "ranged"), ("o1", "merge")} <= out.late
    assert out.activities[("o1", "a")]["contact_id"] == "C2" and out.activities[("o1", "b")]["contact_id"] == "C8"
    # Without the lost message the same expiries are what they were: broken assumptions.
    problems = expected(s.messages, expired={("o1", "ranged"), ("o1", "merge")}, now=NOW).problems
    assert sum("expired although its target was committed" in p for p in problems) == 2
    assert any("request rest finds no row" in p for p in problems)


def test_assumptions_the_oracle_cannot_be_exact_without_are_reported():
    s = Script().send(ACTIVITIES, activity("a", lead_id="L1"))
    s.send(
        MUTATIONS,
        request("r1", "convert", 1, from_field="lead_id", from_id="L1", to_field="contact_id", to_id="C2"),
        round=1,
    )
    s.send(ACTIVITIES, activity("b", lead_id="L1"), round=2)  # converted or not, depending on when the batch ran
    s.send(MUTATIONS, request("r2", "delete", 2, field="contact_id", id="C404"), round=3)  # no row: held back or not
    s.send(
        MUTATIONS, request("r3", "delete", 3, engagement_id="a"), round=4, gate=Gate(INGESTION, ACTIVITIES, 1)
    )  # gate too old
    problems = expected(s.messages, now=NOW).problems
    assert any("comes after it" in p for p in problems)
    assert any("finds no row" in p for p in problems)
    assert any("not gated" in p for p in problems)


def test_an_erased_subject_is_nowhere_in_its_org_and_its_namesake_elsewhere_stays():
    s = Script().send(ACTIVITIES, activity("a", lead_id="S1")).send(ACTIVITIES, activity("n", org="o2", lead_id="S1"))
    s.send(ACTIVITIES, activity("d", lead_id="S1")).send(ACTIVITIES, activity("d", lead_id="S1"))  # a retry of it too
    s.send(ACTIVITIES, b'{"engagement_id": "x", "lead_id": "S1", ')  # rejected, no org: matched in any org's list
    s.send(
        GDPR,
        {
            "request_id": "g1",
            "org_id": "o1",
            "request_time": "2026-01-05T08:00:00Z",
            "kind": "erasure",
            "subject_id": "S1",
        },
        round=1,
    )
    s.send(ACTIVITIES, activity("after", lead_id="S1"), round=3, gate=Gate(RETENTION, GDPR, 1))
    s.send(ACTIVITIES, activity("other", lead_id="S10"), round=3)  # a longer id is another person
    out = expected(s.messages, now=NOW)
    assert set(out.activities) == {("o2", "n"), ("o1", "other")}
    assert out.quarantine[ACTIVITIES] == Counter() and out.gdpr_requests == {("o1", "g1")} and out.problems == []

    s.send(ACTIVITIES, activity("ungated", lead_id="S1"), round=4)  # could be stored before the erasure commits
    assert any("ungated" in p for p in expected(s.messages, now=NOW).problems)


def test_bad_gdpr_requests_by_reason():
    base = {
        "request_id": "g",
        "org_id": "o1",
        "request_time": "2026-01-05T08:00:00Z",
        "kind": "erasure",
        "subject_id": "X1",
    }
    s = Script().send(GDPR, {**base, "kind": "forget"}).send(GDPR, {k: v for k, v in base.items() if k != "subject_id"})
    s.send(GDPR, {**base, "request_time": "2099-01-01T00:00:00Z"}).send(GDPR, json.dumps(base).encode()[:-7])
    s.send(GDPR, {**base, "kind": "retention", "retention_days": 0})
    out = expected(s.messages, now=NOW)
    assert out.quarantine[GDPR] == Counter(
        {"not_in_enum": 1, "missing_required": 1, "request_time_in_future": 1, "malformed_record": 1, "out_of_range": 1}
    )
    assert out.gdpr_requests == set()


def retention(rid: str, days: int, org: str = "o1", request_time: str = "2026-01-05T08:00:00Z") -> dict:
    return {"request_id": rid, "org_id": org, "request_time": request_time, "kind": "retention", "retention_days": days}


def old(eid: str, day: str, org: str = "o1", **columns) -> dict:
    return activity(eid, org, event_time=f"{day}T12:00:00Z", **columns)


def retention_script() -> Script:
    """o1's old activities old1 (2023-07-01) and old2 (2023-07-02) in round 0 and old3 (2023-07-03) in round 2, o2's
    other (2023-07-01) in round 0, a regular activity; in round 1 a retention request of o1 (sent twice) whose
    cut-off is 2023-07-03: its request_time's UTC day, 2026-01-06, less 918 days."""
    s = (
        Script()
        .send(ACTIVITIES, old("old1", "2023-07-01", lead_id="LT1"))
        .send(ACTIVITIES, old("old2", "2023-07-02", contact_id="CT1"))
    )
    s.send(ACTIVITIES, old("other", "2023-07-01", org="o2", lead_id="LT1")).send(
        ACTIVITIES, activity("a", lead_id="L1")
    )
    ttl = retention("r1", 918, request_time="2026-01-05T23:30:00-05:00")  # 2026-01-06 in UTC
    s.send(GDPR, ttl, round=1).send(GDPR, ttl, round=1)
    return s.send(ACTIVITIES, old("old3", "2023-07-03", lead_id="LT1"), round=2)  # on the cut-off day: not older


def test_a_retention_request_deletes_its_orgs_rows_before_its_cutoff_and_counts_them_in_its_audit_row():
    out = expected(retention_script().messages, now=NOW)
    assert out.activities == {
        ("o1", "a"): row(lead_id="L1"),
        ("o1", "old3"): row(lead_id="LT1", engagement_date=date(2023, 7, 3)),
        ("o2", "other"): row(org="o2", lead_id="LT1", engagement_date=date(2023, 7, 1)),
    }
    assert out.gdpr_requests == {("o1", "r1")} and out.removed == {("o1", "r1"): 2}  # one audit row, two rows removed
    assert out.quarantine[GDPR] == Counter({DUPLICATE: 1}) and out.problems == []


def test_retention_requests_count_in_request_order_and_an_activity_the_broker_lost_is_just_not_there():
    from benchmarks.soak.reconcile import as_delivered

    s = retention_script()
    s.send(GDPR, retention("r2", 919, request_time="2026-01-06T08:00:02Z"), round=3)  # cut-off 2023-07-02: nothing left
    s.send(GDPR, retention("r3", 917, request_time="2026-01-06T08:00:03Z"), round=3)  # cut-off 2023-07-04: old3 goes
    out = expected(s.messages, now=NOW)
    assert set(out.activities) == {("o1", "a"), ("o2", "other")} and out.problems == []
    assert out.removed == {("o1", "r1"): 2, ("o1", "r2"): 0, ("o1", "r3"): 1}

    on_topic = Counter((m.topic, m.value) for m in s.messages if b'"old2"' not in m.value)  # the broker lost old2
    delivered, _, lost = as_delivered(s.messages, on_topic)
    out = expected(delivered, now=NOW, lost=lost)
    assert out.removed == {("o1", "r1"): 1, ("o1", "r2"): 0, ("o1", "r3"): 1} and out.problems == []


def test_retention_outcomes_that_depend_on_timing_are_reported():
    late = retention_script().send(
        ACTIVITIES, old("late", "2023-07-02", lead_id="LT9"), round=2
    )  # before the cut-off, after the request
    assert any(
        "late, dated before the cut-off of retention request r1" in p for p in expected(late.messages, now=NOW).problems
    )
    ungated = (
        Script()
        .send(ACTIVITIES, old("old1", "2023-07-01"))
        .send(GDPR, retention("r1", 900), round=1, gate=Gate(INGESTION, ACTIVITIES, -1))
    )
    assert any("r1 is not gated" in p for p in expected(ungated.messages, now=NOW).problems)
    # sent in one order, applied in another when one batch holds both: which of them a row counts for depends on that
    swapped = retention_script().send(GDPR, retention("r2", 917, request_time="2026-01-06T08:00:02Z"), round=3)
    swapped.send(GDPR, retention("r0", 919, request_time="2026-01-06T08:00:01Z"), round=3)
    assert any("retention request r0 is sent after r2" in p for p in expected(swapped.messages, now=NOW).problems)
    touched = retention_script().send(
        MUTATIONS, request("m1", "delete", 1, field="contact_id", id="CT1"), round=1
    )  # old2's owner
    dated = retention_script().send(
        MUTATIONS, request("m2", "update", 1, engagement_id="a", record={"engagement_date": "2023-01-01"}), round=1
    )
    for s, rid in ((touched, "m1"), (dated, "m2")):
        assert any(
            f"mutation request {rid} touches or dates a row before a retention cut-off" in p
            for p in expected(s.messages, now=NOW).problems
        )


def test_reconcile_compares_a_retention_requests_rows_removed_with_its_audit_row(tmp_path):
    """A lake (plain Delta tables, no stack) as the oracle expects it, but for gdpr_audit's rows_removed."""
    from deltalake import write_deltalake

    from benchmarks.soak.reconcile import lake_diff

    s = retention_script()
    rows = [{**r, "engagement_id": eid} for (_, eid), r in expected(s.messages, now=NOW).activities.items()]
    schema = pa.schema(
        [(c, pa.date32() if c == "engagement_date" else pa.string()) for c in ("org_id", "engagement_id", *CHECKED)]
    )
    write_deltalake(str(tmp_path / "engagement_activity"), pa.Table.from_pylist(rows, schema))
    retried = {
        "row_id": "x",
        "error_code": "duplicate_in_batch",
        "column_name": "request_id",
        "org_id": "o1",
        "input": None,
    }  # r1's copy
    write_deltalake(
        str(tmp_path / "quarantine_engagement_gdpr"),
        pa.Table.from_pylist([retried], pa.schema([(n, pa.string()) for n in retried])),
    )

    def differences(rows_removed: int) -> int:
        audit = pa.table({"org_id": ["o1"], "request_id": ["r1"], "rows_removed": pa.array([rows_removed], pa.int64())})
        write_deltalake(str(tmp_path / "gdpr_audit"), audit, mode="overwrite")
        return lake_diff(s.messages, str(tmp_path))[1]

    assert differences(2) == 0
    assert differences(3) == 1


def change(pid: str, seq: int, op: str = "upsert", tenant: str = "acme", **extra) -> dict:
    return {
        "tenant": tenant,
        "primary_id": pid,
        "record_type": "person",
        "op": op,
        "cdc_seq": seq,
        "cdc_ts": "2026-01-05T08:00:00Z",
        **extra,
    }


def test_profiles_fold_by_sequence_with_nulls_deletes_and_a_covered_late_change():
    s = Script().send(PROFILES, change("p1", 1, fields={"email": "a@x", "plan": "free"}, related_ids=["p2", "p2"]))
    s.send(PROFILES, change("p1", 3, fields={"plan": "pro", "email": None}))  # null keeps the email
    s.send(PROFILES, change("p1", 2, fields={"plan": "trial"}))  # late, and p1@3 sets plan too: dropped or overridden
    s.send(PROFILES, change("p2", 5, fields={"score": 1})).send(PROFILES, change("p2", 6, "delete"))
    s.send(PROFILES, change("p2", 4, fields={"tags": ["a"]}))  # late below a delete: the tombstone stays
    s.send(PROFILES, change("p3", 1, fields={"score": 1})).send(PROFILES, change("p3", 2, "delete"))
    s.send(PROFILES, change("p3", 3, fields={"country": "DE"}))  # re-created from empty fields
    s.send(PROFILES, b'{"tenant": "acme", "primary_id": ').send(PROFILES, change("p4", 1, op="merge"))
    s.send(PROFILES, change("p4", 2, fields="[1, 2]")).send(
        PROFILES, {k: v for k, v in change("p4", 3).items() if k != "primary_id"}
    )
    s.send(PROFILES, change("p4", 4, tenant="Bad Tenant"))
    out = expected(s.messages, now=NOW)
    assert out.profiles == {
        "acme": {
            "p1": {"deleted": False, "fields": {"email": "a@x", "plan": "pro"}, "linked_ids": ["p2"], "cdc_seq": 3},
            "p2": {"deleted": True, "fields": None, "linked_ids": [], "cdc_seq": 6},
            "p3": {"deleted": False, "fields": {"country": "DE"}, "linked_ids": [], "cdc_seq": 3},
        }
    }
    assert out.quarantine[PROFILES] == Counter(
        {"malformed_record": 1, "not_in_enum": 1, "invalid_json": 1, "missing_required": 1, "pattern_mismatch": 1}
    )
    assert out.problems == []

    s.send(PROFILES, change("p1", 2, fields={"country": "FR"}))  # a late key p1@3 does not set: kept or not by batching
    assert any("depends on batching" in p for p in expected(s.messages, now=NOW).problems)


def erasure_request(rid: str, subject: str, tenant: str = "acme", **extra) -> dict:
    return {"request_id": rid, "tenant": tenant, "subject_id": subject, "request_time": "2026-01-05T08:00:10Z", **extra}


def staged(round: int) -> Gate:  # a profile erasure request's gate: the dumper staged every change of rounds <= round
    return Gate(PROFILE_CDC, PROFILES, round)


def erased(round: int) -> Gate:  # a later change's gate: the erasure stream committed the requests of rounds <= round
    return Gate(PROFILE_ERASURE, PROFILE_ERASURES, round, queued=True)


def profile_erasure_script() -> Script:
    """acme's S linked to L, erased in round 2 (sent twice), with bad requests of four kinds; the same S in globex, p1
    in acme; later changes of S and L, of N linking to S, and a bad change naming S, gated on the erasure."""
    s = (
        Script()
        .send(PROFILES, change("S", 1, fields={"email": "s@x"}, related_ids=["L"]))
        .send(PROFILES, change("L", 1, fields={"plan": "pro"}))
    )
    s.send(
        PROFILES, change("S", 1, tenant="globex", fields={"email": "namesake@x"})
    )  # the same id in another tenant: another person
    s.send(PROFILES, change("p1", 1, fields={"score": 5}))
    s.send(PROFILES, change("S", 2, fields={"plan": "free"}), round=1)  # no related_ids: the link stays
    s.send(
        PROFILES, change("S", 3, fields="[1, 2]"), round=1
    )  # bad, naming S: quarantined, then deleted by the erasure
    request = erasure_request("pe1", "S")
    s.send(PROFILE_ERASURES, request, round=2, gate=staged(1)).send(
        PROFILE_ERASURES, request, round=2, gate=staged(1)
    )  # a retry
    s.send(PROFILE_ERASURES, json.dumps(erasure_request("pe2", "X1")).encode()[:-7], round=2)
    s.send(PROFILE_ERASURES, erasure_request("pe3", "X2", tenant="Acme Corp"), round=2)
    s.send(PROFILE_ERASURES, {k: v for k, v in erasure_request("pe4", "X3").items() if k != "subject_id"}, round=2)
    s.send(PROFILE_ERASURES, erasure_request("pe5", "X4", request_time="soon"), round=2)
    for pid, extra in (("S", {}), ("L", {}), ("N", {"related_ids": ["S"]})):
        s.send(PROFILES, change(pid, 9, fields={"score": 1}, **extra), round=4, gate=erased(2))
    s.send(PROFILES, change("S", 10, op="merge"), round=4, gate=erased(2))  # bad, naming S: dropped too
    s.send(PROFILES, change("p1", 2, fields={"plan": "pro"}), round=4)
    return s.send(PROFILES, change("S", 2, tenant="globex", fields={"plan": "pro"}), round=4)


def test_a_profile_erasure_removes_the_linked_identity_and_the_dumper_drops_what_names_it_later():
    out = expected(profile_erasure_script().messages, now=NOW)
    assert out.profiles == {  # S and L gone from acme, N never stored; p1 and globex's S stay
        "acme": {"p1": {"deleted": False, "fields": {"score": 5, "plan": "pro"}, "linked_ids": [], "cdc_seq": 2}},
        "globex": {
            "S": {"deleted": False, "fields": {"email": "namesake@x", "plan": "pro"}, "linked_ids": [], "cdc_seq": 2}
        },
    }
    assert out.profile_erasures == {("acme", "pe1"): 2}  # its audit row: S and L
    # four later records naming S or L (the dumper's), the retried request (the erasure stream's); the bad change
    # before the request is neither quarantined nor suppressed: the erasure deletes it from the quarantine
    assert out.suppressed == Counter({PROFILE_CDC: 4, PROFILE_ERASURE: 1})
    assert out.quarantine[PROFILES] == Counter()
    assert out.quarantine[PROFILE_ERASURES] == Counter(
        {"malformed_record": 1, "pattern_mismatch": 1, "missing_required": 1, "wrong_type": 1}
    )
    assert out.problems == []


def test_a_tombstone_goes_with_its_erasure_and_an_id_found_nowhere_is_still_suppressed():
    s = Script().send(PROFILES, change("A", 1, fields={"email": "a@x"})).send(PROFILES, change("A", 2, "delete"))
    s.send(PROFILES, change("B", 1, fields={"email": "b@x"}, related_ids=["C"]))  # another identity of acme: stays
    assert expected(s.messages, now=NOW).profiles["acme"]["A"] == {
        "deleted": True,
        "fields": None,
        "linked_ids": [],
        "cdc_seq": 2,
    }
    s.send(PROFILE_ERASURES, erasure_request("pe1", "A"), round=1, gate=staged(0))
    s.send(PROFILE_ERASURES, erasure_request("pe2", "Z", tenant="globex"), round=1, gate=staged(0))
    s.send(PROFILES, change("Z", 1, tenant="globex", fields={"plan": "pro"}), round=3, gate=erased(1))
    out = expected(s.messages, now=NOW)
    assert out.profiles == {
        "acme": {"B": {"deleted": False, "fields": {"email": "b@x"}, "linked_ids": ["C"], "cdc_seq": 1}}
    }
    assert out.profile_erasures == {("acme", "pe1"): 1, ("globex", "pe2"): 1}
    assert out.suppressed == Counter({PROFILE_CDC: 1}) and out.problems == []
    s.send(PROFILE_ERASURES, erasure_request("pe3", "C"), round=4, gate=staged(3))  # B's link: B goes with C
    out = expected(s.messages, now=NOW)
    assert "acme" not in out.profiles and out.profile_erasures[("acme", "pe3")] == 2 and out.problems == []


def test_profile_erasure_outcomes_that_depend_on_timing_are_reported():
    def problems(s: Script) -> list[str]:
        return expected(s.messages, now=NOW).problems

    def base() -> Script:
        return Script().send(PROFILES, change("S", 1, fields={"email": "s@x"}))

    ungated = base().send(PROFILE_ERASURES, erasure_request("pe1", "S"), round=1)
    assert any("pe1 is not gated on the dumper" in p for p in problems(ungated))
    for gate in (None, Gate(PROFILE_ERASURE, PROFILE_ERASURES, 1)):  # not gated, or not waiting for the queued request
        late = base().send(PROFILE_ERASURES, erasure_request("pe1", "S"), round=1, gate=staged(0))
        late.send(PROFILES, change("S", 2, fields={"plan": "pro"}), round=3, gate=gate)
        assert any("names an erased id after its erasure's gate round" in p for p in problems(late))
    relinked = Script().send(PROFILES, change("S", 1, related_ids=["L"])).send(PROFILES, change("S", 2, related_ids=[]))
    relinked.send(
        PROFILE_ERASURES, erasure_request("pe1", "S"), round=1, gate=staged(0)
    )  # L goes if S@1 is not merged yet
    assert any("an older link of its identity was replaced" in p for p in problems(relinked))
    refused = base().send(PROFILE_ERASURES, erasure_request("pe1", "S"), round=1, gate=staged(0))
    refused.send(PROFILE_ERASURES, erasure_request("pe2", "S", request_time="soon"), round=1)  # purged or suppressed
    assert any("refused profile erasure request names an erased id" in p for p in problems(refused))
    assert problems(base().send(PROFILE_ERASURES, erasure_request("pe1", "S"), round=1, gate=staged(0))) == []


def test_reconcile_compares_profile_erasure_audit_rows_and_suppressed_records(tmp_path):
    """A lake (plain Delta tables, no stack) as the oracle expects it, but for the erasure audit's ids_erased and the
    suppressed records' counts."""
    from deltalake import write_deltalake

    from benchmarks.soak.reconcile import lake_diff

    s = profile_erasure_script()
    oracle = expected(s.messages, now=NOW)
    raw = pa.schema(
        [
            ("primary_id", pa.string()),
            ("deleted", pa.bool_()),
            ("fields", pa.string()),
            ("linked_ids", pa.list_(pa.string())),
            ("cdc_seq", pa.int64()),
        ]
    )
    for tenant, rows in oracle.profiles.items():
        write_deltalake(
            str(tmp_path / "profile_raw" / tenant),
            pa.Table.from_pylist(
                [{"primary_id": pid, **r, "fields": json.dumps(r["fields"])} for pid, r in rows.items()], raw
            ),
        )
    refused = [
        {"row_id": str(i), "error_code": code, "column_name": None, "org_id": None, "input": None}
        for i, code in enumerate(("malformed_record", "pattern_mismatch", "missing_required", "wrong_type"))
    ]
    write_deltalake(
        str(tmp_path / "quarantine_profile_erasure"),
        pa.Table.from_pylist(refused, pa.schema([(n, pa.string()) for n in refused[0]])),
    )

    def differences(ids_erased: int, dumper_dropped: int) -> int:
        audit = pa.table({"tenant": ["acme"], "request_id": ["pe1"], "ids_erased": pa.array([ids_erased], pa.int64())})
        write_deltalake(str(tmp_path / "profile_erasure_audit"), audit, mode="overwrite")
        dropped = pa.table(
            {
                "stream": [PROFILE_CDC, PROFILE_CDC, PROFILE_ERASURE],
                "records": pa.array([dumper_dropped - 1, 1, 1], pa.int64()),
            }
        )
        write_deltalake(str(tmp_path / "profile_suppressed_records"), dropped, mode="overwrite")
        return lake_diff(s.messages, str(tmp_path))[1]

    assert differences(2, 4) == 0
    assert differences(1, 4) == 1  # the audit row's ids_erased
    assert differences(2, 6) == 2  # two records too many suppressed by the dumper


def test_the_soak_workload_is_deterministic_and_exact_and_its_own_model_agrees_with_the_oracle():
    def generate(seed):
        w = Workload(seed=seed)
        for _ in range(120):
            w.next_round()
        w.remaining_rounds()
        return w

    w = generate(3)
    assert [m.value for m in w.messages] == [m.value for m in generate(3).messages]
    assert [f.data for f in w.landing] == [f.data for f in generate(3).landing]
    assert not w.scheduled and [m.index for m in w.messages] == list(range(len(w.messages)))
    out = expected(w.messages, now=NOW, landed=w.landing)
    assert out.problems == []
    intents = Counter(m.intent for m in w.messages)
    assert out.quarantine[ACTIVITIES][DUPLICATE] == intents["duplicate"] + intents["old_duplicate"]
    assert out.quarantine[MUTATIONS][DUPLICATE] == intents["duplicate_request"]
    assert out.quarantine[GDPR][DUPLICATE] == intents["retention_duplicate"]
    for topic in (ACTIVITIES, MUTATIONS, GDPR, PROFILES, PROFILE_ERASURES):
        meant = Counter(m.intent[4:] for m in w.messages if m.topic == topic and m.intent.startswith("bad:"))
        assert meant and +Counter({k: v for k, v in out.quarantine[topic].items() if k != DUPLICATE}) == meant, topic
    assert len(out.late) == intents["late_request"] > 0 and intents["subject_after_erasure"] > 0
    # a landing file every 15 rounds: every bad kind occurs, and the oracle finds each line as the generator meant it
    lines = Counter(i for f in w.landing for i in f.intents)
    assert [f.round for f in w.landing] == list(range(14, 120, 15))
    assert out.quarantine[LANDING] == Counter({i[4:]: n for i, n in lines.items() if i != "good"})
    assert set(out.quarantine[LANDING]) == {kind for kind, _ in BAD_MEMBERS} and len(out.members) == lines["good"]
    # the generator tracks the rows it aims requests at; the oracle recomputes them from the bytes alone
    isolated = {
        json.loads(m.value)["engagement_id"]
        for m in w.messages
        if m.intent in ("late_target", "namesake", "old_activity")
    }
    table = {eid: r for (_, eid), r in out.activities.items() if eid not in isolated}
    assert table == {eid: {k: v for k, v in r.items() if k != "round"} for eid, r in w.rows.items()}
    # retention at rounds 45 and 105, of orgs 1 and 2: by the rounds the generator sent them in, an old activity goes iff a
    # request of its org came in a later round (the oracle goes by dates and cut-offs), and counts for the first such
    assert [(org, k) for org, k, _ in w.cutoffs] == [(ORGS[0], 45), (ORGS[1], 105)]
    deleting = {
        eid: next((k for org, k, _ in w.cutoffs if org == r["org_id"] and r["round"] < k), None)
        for eid, r in w.old.items()
    }
    survivors = {eid for (_, eid), r in out.activities.items() if eid in w.old}
    assert survivors == {eid for eid, k in deleting.items() if k is None} and len(survivors) < len(w.old)
    request_id = {m.round: json.loads(m.value)["request_id"] for m in w.messages if m.intent == "retention"}
    assert out.removed == {(org, request_id[k]): list(deleting.values()).count(k) for org, k, _ in w.cutoffs}
    assert all(n > 0 for n in out.removed.values()) and set(out.removed) <= out.gdpr_requests
    assert any(
        r["round"] > 105 for eid, r in w.old.items() if eid in survivors and r["org_id"] == ORGS[1]
    )  # after its request: kept
    # profile erasures at rounds 35, 75 and 115 (requests 3 rounds later): every kind once, the tenants in turn. The oracle
    # finds each identity from the CDC bytes; the generator knows which ids it made for it
    assert [(e["round"], e["tenant"], e["kind"]) for e in w.profile_erasures] == [
        (38, TENANTS[0], "linked"),
        (78, TENANTS[1], "alone"),
        (118, TENANTS[2], "nowhere"),
    ]
    assert out.profile_erasures == {(e["tenant"], e["request_id"]): len(e["ids"]) for e in w.profile_erasures}
    assert [len(e["ids"]) for e in w.profile_erasures] == [2, 1, 1]
    for e in w.profile_erasures:
        assert not e["ids"] & set(out.profiles.get(e["tenant"], {}))  # erased, and nothing later brought them back
        assert e["ids"] & set(out.profiles[e["namesake"]])  # the subject's namesake in the next tenant stays
        others = [
            m for m in w.messages if m.intent not in PROFILE_ERASURE_INTENTS
        ]  # no other generator names an erased id
        assert not any(i.encode() in m.value for i in e["ids"] for m in others)
    assert out.suppressed == Counter(
        {
            PROFILE_CDC: intents["after_profile_erasure"] + intents["after_profile_erasure_bad"],
            PROFILE_ERASURE: intents["profile_erasure_duplicate"],
        }
    )
    assert (
        intents["after_profile_erasure_bad"] == intents["erased_profile_bad"] + 1 > 1
    )  # "nowhere" has no bad change before


MEMBERS_CSV = [
    "id,name,bday,level,email,points",
    "1,Ann Lee,01/02/1990,G,ann@example.com,10",  # good: MM/dd/yyyy, a level code
    "2,Mary Ann de Vries,1985-03-04,silver,mary@example.com,0",  # good: the rest of the name is the last name; points' minimum
    "3,Cher,2000-12-31,,cher@example.com,1000000",  # good: one word, no level; points' maximum
    '4,"Unclosed, quote',  # does not parse
    "5,Dan Q,13/45/1990,G,dan@example.com,3",  # the cast fails
    "6,Eve Ng,1990-01-01,G,eve@example.com,many",  # conform fails
    "7,Fay Oh,1990-01-01,gold,fay-at-example,3",  # a bad email
    "8,Gil Po,1990-01-01,gold,,3",  # no email
    "9,J0hn Doe,1800-01-01,gold,,-5",  # four validation errors, three codes
    "",  # blank: no record
    "10,Hal Wu,1990-01-01,X,hal@example.com,3",  # a level with no mapping
    "11,Ida Ky,1990-01-01,b,ida@example.com,5\r",  # good: a CRLF line, a lower-case code
]


def member(member_id, first_name, last_name, birth_date, rewards_level, email, points) -> dict:
    return dict(
        member_id=member_id,
        first_name=first_name,
        last_name=last_name,
        birth_date=birth_date,
        rewards_level=rewards_level,
        email=email,
        points=points,
    )


def test_landing_lines_become_typed_rows_by_member_id_or_count_once_under_their_error_codes():
    data = ("\n".join(MEMBERS_CSV) + "\n").encode()
    out = expected([], now=NOW, landed=[LandingFile(0, "a.csv", data, ())])
    assert out.members == {
        1: member(1, "Ann", "Lee", date(1990, 1, 2), "gold", "ann@example.com", 10),
        2: member(2, "Mary", "Ann de Vries", date(1985, 3, 4), "silver", "mary@example.com", 0),
        3: member(3, "Cher", None, date(2000, 12, 31), None, "cher@example.com", 1_000_000),
        11: member(11, "Ida", "Ky", date(1990, 1, 1), "bronze", "ida@example.com", 5),
    }
    assert out.quarantine[LANDING] == Counter(
        {
            "malformed_record": 1,
            "wrong_type": 2,
            "pattern_mismatch": 1,
            "missing_required": 1,
            "missing_required+out_of_range+pattern_mismatch": 1,
            "unmapped_value": 1,
        }
    )
    assert out.problems == [] and all(not q for topic, q in out.quarantine.items() if topic != LANDING)

    again = LandingFile(
        1, "b.csv", (MEMBERS_CSV[0] + "\n" + MEMBERS_CSV[1] + "\n").encode(), ()
    )  # member 1 again: appended twice
    assert any(
        "member 1 is in two landed lines" in p
        for p in expected([], now=NOW, landed=[LandingFile(0, "a.csv", data, ()), again]).problems
    )


def test_landing_files_leave_the_kafka_workload_of_a_seed_as_it_was():
    def first_rounds(**options) -> Workload:
        w = Workload(seed=7, **options)
        for _ in range(40):
            w.next_round()
        return w

    with_files, without = first_rounds(), first_rounds(landing_every=0)
    assert (
        with_files.messages == without.messages
        and [f.round for f in with_files.landing] == [14, 29]
        and without.landing == []
    )
    digest, kafka = hashlib.sha256(), [m for m in with_files.messages if not added_later(m)]
    for m in kafka:
        gate = m.gate and (m.gate.stream, m.gate.topic, m.gate.round)
        digest.update(repr((m.round, m.topic, m.key, m.value, m.intent, gate)).encode())
    # Seed 7's first 40 rounds as the workload produced them before landing files were added. A change here moves
    # every seed's Kafka workload (and what earlier soak reports mean): make it on purpose, then update the digest.
    assert (len(kafka), digest.hexdigest()) == (517, "39b227a03140a730e424686876c85ba6297d94918f5ca47dd321585a5d8a9164")


def seed_7_rounds(**options) -> list[tuple]:
    """(round, topic, key, value, intent, gate) of the messages of seed 7's first 130 rounds, with these options."""
    w = Workload(seed=7, **options)
    for _ in range(130):
        w.next_round()
    return [(m.round, m.topic, m.key, m.value, m.intent, m.gate) for m in w.messages]


def test_profile_erasure_leaves_the_other_kafka_messages_of_a_seed_as_they_were():
    with_erasure, without = seed_7_rounds(), seed_7_rounds(profile_erasure_every=0)
    added = [m for m in with_erasure if m[4] in PROFILE_ERASURE_INTENTS or m[1] == PROFILE_ERASURES]
    assert [m for m in with_erasure if m not in added] == without
    assert [m[0] for m in added if m[4] == "profile_erasure"] == [38, 78, 118]
    assert Counter(m[4] for m in added if m[1] == PROFILE_ERASURES and m[4].startswith("bad:")) == Counter(
        f"bad:{k}" for k in list(BAD_PROFILE_ERASURES)[:3]
    )
    for m in (
        added
    ):  # the request waits for the dumper; what follows it for the erasure stream (and the request itself, queued)
        if m[4].startswith("profile_erasure"):
            assert m[5] == Gate(PROFILE_CDC, PROFILES, m[0] - 1)
        elif m[4].startswith("after_profile_erasure"):
            assert (
                m[5].queued
                and (m[5].stream, m[5].topic) == (PROFILE_ERASURE, PROFILE_ERASURES)
                and m[0] - 4 <= m[5].round < m[0]
            )
        else:
            assert m[5] is None


def test_retention_leaves_the_other_kafka_messages_of_a_seed_as_they_were():
    with_retention, without = seed_7_rounds(), seed_7_rounds(retention_every=0)
    assert [m for m in with_retention if m[4] not in RETENTION_INTENTS] == without
    added = Counter(m[4] for m in with_retention if m[4] in RETENTION_INTENTS)
    assert added["retention"] == 2 and added["old_activity"] > 30
    assert all(
        m[5] == Gate(INGESTION, ACTIVITIES, m[0] - 1) and m[1] == GDPR
        for m in with_retention
        if m[4].startswith("retention")
    )


class FakeProducer:
    """Delivers on poll, offsets counted per topic on partition 0."""

    def __init__(self):
        self.sent, self.reports = [], []

    def produce(self, topic, value, key, on_delivery):
        self.sent.append((topic, value))
        self.reports.append((on_delivery, sum(1 for t, _ in self.sent if t == topic) - 1))

    def poll(self, timeout=0):
        reports, self.reports = self.reports, []
        for on_delivery, offset in reports:
            on_delivery(
                None, type("Delivered", (), {"partition": lambda self: 0, "offset": lambda self, o=offset: o})()
            )


def test_the_sender_holds_a_gated_message_until_the_stream_committed_the_rounds_it_waits_for():
    from benchmarks.soak.__main__ import Sender

    producer = FakeProducer()
    sender = Sender(lambda: producer, {ACTIVITIES: "a", MUTATIONS: "m"})
    message = lambda i, r, topic, gate=None: Message(i, r, topic, b"k", f"v{i}".encode(), "test", gate)  # noqa: E731
    sender.send([message(0, 0, ACTIVITIES), message(1, 0, ACTIVITIES)], {})
    gated = [
        message(2, 1, MUTATIONS, Gate(INGESTION, ACTIVITIES, 0)),
        message(3, 1, MUTATIONS, Gate(INGESTION, ACTIVITIES, 0)),
    ]
    sender.send(gated, {})
    assert [t for t, _ in producer.sent] == ["a", "a"] and sender.unsent() == 2  # both wait: nothing committed yet
    sender.pump({"ingestion": {0: 1}})  # one of the two activities committed
    assert sender.unsent() == 2
    sender.pump({"ingestion": {0: 2}})
    assert [v for _, v in producer.sent] == [b"v0", b"v1", b"v2", b"v3"]


def test_a_queued_gate_waits_for_the_erasure_request_still_waiting_for_its_own_gate():
    """Without `queued`, a later change of an erased profile would go as soon as nothing of the erasure topic was
    produced, i.e. while its request still waits for the dumper: it could be staged before the erasure."""
    from dataclasses import replace

    from benchmarks.soak.__main__ import Sender

    producer = FakeProducer()
    sender = Sender(lambda: producer, {PROFILES: "p", PROFILE_ERASURES: "e"})
    sender.send([Message(0, 2, PROFILES, b"k", b"change", "test")], {})  # produced, not staged yet
    request = Message(1, 3, PROFILE_ERASURES, b"k", b"request", "test", staged(2))
    later = Message(2, 5, PROFILES, b"k", b"later", "test", erased(3))
    sender.send([request], {})
    sender.send([later], {})
    assert [v for _, v in producer.sent] == [b"change"] and sender.unsent() == 2
    assert sender.is_open(replace(later.gate, queued=False), {})  # the hole `queued` closes
    sender.pump({PROFILE_CDC: {0: 1}})  # staged: the request goes, the later change waits for the erasure stream
    assert [v for _, v in producer.sent] == [b"change", b"request"]
    sender.pump({PROFILE_CDC: {0: 1}})
    assert sender.unsent() == 1
    sender.pump({PROFILE_CDC: {0: 1}, PROFILE_ERASURE: {0: 1}})
    assert [v for _, v in producer.sent] == [b"change", b"request", b"later"]


def test_what_the_broker_lost_or_repeated_is_what_the_oracle_sees():
    from benchmarks.soak.reconcile import as_delivered

    s = Script().send(ACTIVITIES, activity("a")).send(ACTIVITIES, activity("b")).send(ACTIVITIES, activity("c"))
    on_topic = Counter({(ACTIVITIES, s.messages[0].value): 2, (ACTIVITIES, s.messages[2].value): 1})
    delivered, notes, lost = as_delivered(s.messages, on_topic)
    assert [m.index for m in delivered] == [0, 0, 2] and len(notes) == 2 and [m.index for m in lost] == [1]
    assert expected(delivered, now=NOW).quarantine[ACTIVITIES] == Counter({DUPLICATE: 1})
