"""What `engagement-platform status` prints, from facts given in memory (no server, no lake): the table, the
notes a person acts on (a pause and how to resume it, a held lock), the JSON document, and the columns of a
service that did not answer."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from engagement_platform.status.report import (
    COMMITTING,
    DONE,
    NONE,
    PLANNED,
    UNAVAILABLE,
    Attempts,
    Batch,
    Lag,
    Lock,
    Report,
    Service,
    StreamStatus,
    batch_state,
    planned_lag,
    render_text,
    report_json,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def sample() -> Report:
    """One stream in each state a person meets: committing after a crash, paused, done and idle, planned with
    its services away, nothing planned."""
    activity_lock = Lock("engagement_activity", "mutation/7", "host-a", 4242, "9f1c2d", "mutation (mutation/7)")
    return Report(
        NOW,
        (
            Service("lake", True, "/srv/lake"),
            Service("kafka", True, "kafka:9092"),
            Service("zookeeper", True, "zk:2181/engagement_platform"),
            Service("dagster", False, "DAGSTER_HOME is not set"),
        ),
        (
            StreamStatus(
                "ingestion",
                "ingestion",
                None,
                "kafka engagement.activities",
                Batch(12, COMMITTING, ("engagement_activity",), NOW - timedelta(seconds=95), 1250),
                Attempts(1, 3, died=1, last_failed_run="a1b2c3", last_failed_job="engagement_ingestion_job"),
                activity_lock,
                Lag(1250, 300, 95.0, "the oldest uncommitted record"),
            ),
            StreamStatus(
                "retention",
                "retention",
                None,
                "kafka engagement.gdpr",
                Batch(3, PLANNED, (), NOW - timedelta(hours=2), 4),
                Attempts(3, 3, last_failed_run="77e0aa", last_failed_job="engagement_retention_job", paused=True),
                activity_lock,
                Lag(4, 0, 7200.0, "batch 3 planned at ..."),
            ),
            StreamStatus(
                "mutation",
                "mutation",
                None,
                "kafka engagement.mutations",
                Batch(7, DONE, (), NOW - timedelta(minutes=5), 40),
                Attempts(0, 3),
                activity_lock,
                Lag(0, 0, 0.0),
            ),
            StreamStatus(
                "profile_processor/tenant01",
                "profile_processor",
                "tenant01",
                "staging versions",
                Batch(5, PLANNED, (), NOW - timedelta(seconds=30)),
                UNAVAILABLE,
                UNAVAILABLE,
                Lag(120, None, 42.5, "CDC times (newest staged - newest merged)"),
            ),
            StreamStatus(
                "profile_cdc",
                "profile_cdc",
                None,
                "kafka profile.cdc",
                Batch(None, NONE),
                Attempts(0, 3),
                None,
                Lag(UNAVAILABLE, UNAVAILABLE, UNAVAILABLE),
            ),
        ),
    )


def row_of(text: str, stream: str) -> list[str]:
    """The cells of `stream`'s row of the table (cells are separated by two spaces or more)."""
    line = next(line for line in text.splitlines() if line.startswith(stream + " "))
    return [cell.strip() for cell in line.split("  ") if cell.strip()]


def test_the_table_has_a_row_per_stream_with_each_column():
    text = render_text(sample())
    assert text.splitlines()[0].split() == [
        "STREAM",
        "BATCH",
        "STATE",
        "ATTEMPTS",
        "LOCK",
        "LAG",
        "RECORDS",
        "LAG",
        "SECONDS",
        "PAUSED",
    ]
    assert row_of(text, "ingestion") == [
        "ingestion",
        "12",
        "committing (engagement_activity)",
        "1/3 +1 died",
        "held by mutation/7",
        "1,250",
        "95",
        "no",
    ]
    assert row_of(text, "retention")[2:] == ["planned", "3/3", "held by mutation/7", "4", "7,200", "PAUSED"]
    assert row_of(text, "mutation")[1:] == ["7", "done", "0/3", "held by mutation/7", "0", "0", "no"]
    assert row_of(text, "profile_processor/tenant01")[1:] == [
        "5",
        "planned",
        UNAVAILABLE,
        UNAVAILABLE,
        "120",
        "42",
        UNAVAILABLE,
    ]
    assert row_of(text, "profile_cdc")[1:] == ["-", "none", "0/3", "-", UNAVAILABLE, UNAVAILABLE, "no"]


def test_a_paused_stream_says_how_to_resume_it():
    text = render_text(sample())
    (paused,) = [line for line in text.splitlines() if "PAUSED after" in line]
    assert paused.startswith("retention: PAUSED after 3 failed attempts. Resume: fix what failed run 77e0aa")
    assert "Runs > 77e0aa > Re-execute > All steps (partition 00000003)" in paused
    assert "`engagement-platform run-batch --stream retention --batch-id 3`" in paused
    assert "ingestion: PAUSED" not in text


def test_the_notes_name_the_unfinished_batches_and_each_held_lock_once():
    text = render_text(sample())
    planned_at = (NOW - timedelta(seconds=95)).isoformat()
    assert f"ingestion: batch 12 planned at {planned_at}, not done, already in engagement_activity" in text
    assert "mutation: batch" not in text, "a done batch needs no note"
    (lock,) = [line for line in text.splitlines() if line.startswith("lock ")]
    assert lock == (
        "lock engagement_activity held by mutation/7 (host host-a, pid 4242, run 9f1c2d); "
        "taken by ingestion, retention, mutation"
    )


def test_services_are_listed_with_what_did_not_answer():
    last = render_text(sample()).splitlines()
    assert last[-2] == (
        "services: lake ok (/srv/lake); kafka ok (kafka:9092); zookeeper ok (zk:2181/engagement_platform); "
        "dagster unavailable (DAGSTER_HOME is not set)"
    )
    assert last[-1] == f"at {NOW.isoformat()}"


def test_the_json_document_holds_every_column_and_round_trips():
    document = json.loads(json.dumps(report_json(sample())))
    assert document["services"]["dagster"] == {"available": False, "detail": "DAGSTER_HOME is not set"}
    streams = {s["stream"]: s for s in document["streams"]}
    ingestion = streams["ingestion"]
    assert ingestion["batch"] == {
        "id": 12,
        "state": "committing",
        "tables_committed": ["engagement_activity"],
        "planned_at": (NOW - timedelta(seconds=95)).isoformat(),
        "records": 1250,
        "partition": "00000012",
    }
    assert ingestion["lock"]["holder"] == "mutation/7" and ingestion["lock"]["run_id"] == "9f1c2d"
    assert ingestion["lag"] == {
        "records": 1250,
        "unplanned": 300,
        "seconds": 95.0,
        "seconds_from": "the oldest uncommitted record",
    }
    assert ingestion["attempts"]["failed"] == 1 and ingestion["attempts"]["max_attempts"] == 3
    assert ingestion["paused"] is False and ingestion["resume"] is None
    assert streams["retention"]["paused"] is True and "Re-execute" in streams["retention"]["resume"]
    tenant = streams["profile_processor/tenant01"]
    assert (tenant["tenant"], tenant["attempts"], tenant["lock"], tenant["paused"]) == (
        "tenant01",
        UNAVAILABLE,
        UNAVAILABLE,
        UNAVAILABLE,
    )
    assert streams["profile_cdc"]["lock"] is None and streams["profile_cdc"]["batch"]["id"] is None


def test_a_processor_tenant_resumes_by_its_tenant_partition():
    status = StreamStatus(
        "profile_processor/tenant02",
        "profile_processor",
        "tenant02",
        "staging versions",
        Batch(9, PLANNED),
        Attempts(3, 3, last_failed_run="r1", last_failed_job="profile_processor_job", paused=True),
        None,
    )
    assert status.resume is not None
    assert "(partition tenant02)" in status.resume
    assert status.resume.endswith("`engagement-platform run-batch --stream profile_processor/tenant02`")


def test_a_stream_that_never_pauses_says_so():
    status = StreamStatus(
        "profile_segments/t1", "profile_segments", "t1", "raw table versions", Batch(2, DONE), Attempts(4, None), None
    )
    report = Report(NOW, (), (status,))
    assert row_of(render_text(report), "profile_segments/t1")[3:] == ["4", "-", "-", "-", "never"]


@pytest.mark.parametrize(
    ("done", "planned", "tables", "state"),
    [
        (False, False, (), NONE),
        (False, True, (), PLANNED),
        (False, True, ("engagement_activity",), COMMITTING),
        (True, True, (), DONE),
    ],
)
def test_batch_state(done, planned, tables, state):
    assert batch_state(done, planned, tables) == state


def test_lag_from_the_plan_only_for_an_unfinished_batch():
    planned_at = NOW - timedelta(seconds=30)
    assert planned_lag(Batch(4, PLANNED, (), planned_at), NOW, 10) == Lag(
        10, 10, 30.0, f"batch 4 planned at {planned_at.isoformat()}"
    )
    assert planned_lag(Batch(4, DONE, (), planned_at), NOW, 0).seconds is None
