"""Erasure that holds, on the real broker, Spark Connect and Delta tables: after an erasure, the subject's
re-sent activities, a mutation into the erased id and repeated requests are dropped by every stream and
counted by hash only; then, with an erasure window of seconds, the upkeep leaves no byte under the lake root
that holds the subject's ids (data, change data, the Delta logs and their checkpoints), while other people's
rows stay and every table still reads with deltalake and with DuckDB."""

from __future__ import annotations

import json
import time
from datetime import date
from pathlib import Path

import pytest
import yaml
from dagster import materialize
from deltalake import DeltaTable

from engagement_platform.engagement.mutation.tables import (
    ENGAGEMENT_MUTATION_REQUESTS,
    ENGAGEMENT_MUTATIONS_PENDING,
    QUARANTINE_ENGAGEMENT_MUTATIONS,
)
from engagement_platform.engagement.retention.erasure import VACUUMED_TABLES, rows_naming
from engagement_platform.engagement.retention.requests import ERASURE
from engagement_platform.engagement.retention.tables import GDPR_AUDIT, QUARANTINE_ENGAGEMENT_GDPR
from engagement_platform.engagement.tables import (
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_ACTIVITY_CHANGES,
    ENGAGEMENT_ERASED_SUBJECTS,
    ENGAGEMENT_NOTIFICATIONS,
    ENGAGEMENT_SUPPRESSED_RECORDS,
    QUARANTINE_ENGAGEMENT_INGESTION,
)
from engagement_platform.engagement.upkeep.assets import engagement_layout_upkeep
from engagement_platform.ingest.config import load_pipelines
from engagement_platform.lake.changes import START, ChangesExpired, changes_since
from engagement_platform.lake.suppression import subject_hash
from engagement_platform.lake.suppression_tables import load_suppressed
from engagement_platform.landing.apply import file_plan, run_file_batch
from engagement_platform.resources import LakeResource
from engagement_platform.settings import load_settings
from engagement_platform_tests.support.activities import ingest, rows_of
from engagement_platform_tests.support.duckdb_reader import same_rows
from engagement_platform_tests.support.erasure import ASKED, activity, gdpr, produce, retain
from engagement_platform_tests.support.lake_bytes import files_holding
from engagement_platform_tests.support.mutations import mutate

REPO = Path(__file__).resolve().parents[3]
A, B = "00D000001", "00D000002"
LEAD, CONTACT, KEPT = "00QGONE0001", "003GONE0002", "00QSTAYS001"
WINDOW_S = 4  # EP_ERASURE_WINDOW for this test: removed files and log entries leave after half of it
DAY = date(2026, 1, 10)


def request(rid, op, **fields) -> dict:
    return {"request_id": rid, "org_id": A, "request_time": ASKED, "op": op, **fields}


def subject_world(spark, kafka, topic, mutation_topic, lake, checkpoints) -> None:
    """The subject (a lead and a contact of org A) in every table, its images in the change log included."""
    produce(
        kafka,
        topic,
        [
            activity("a1", A, DAY, lead=LEAD),
            activity("a2", A, DAY, lead=LEAD),
            activity("a3", A, DAY, contact=CONTACT),
            activity("a4", A, DAY, lead=KEPT),
            activity("b1", B, DAY, lead="00QOTHERORG"),
            {
                **activity("q1", A, DAY, lead=LEAD),
                "event_time": "yesterday",
            },  # quarantined with the id in its raw bytes
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
            request("m1", "delete", engagement_id="a2"),  # the change log now holds a2's image, lead LEAD
            request(
                "m2", "update", engagement_id="a3", record={"contact_id": CONTACT, "subject": "call with 003GONE0002"}
            ),
            request(
                "m3", "convert", from_field="lead_id", from_id="00QNOTYET", to_field="contact_id", to_id=CONTACT
            ),  # pending
        ],
    )
    assert any(r["lead_id"] == LEAD for r in lake.read(ENGAGEMENT_ACTIVITY_CHANGES.name).to_pylist())


def test_an_erased_subject_never_comes_back_and_leaves_every_byte_of_the_lake_within_the_window(
    spark, kafka, topic, gdpr_topic, mutation_topic, lake, lake_root, checkpoints, monkeypatch
):
    monkeypatch.setenv("EP_ERASURE_WINDOW", f"{WINDOW_S}s")
    secret = load_settings().erasure.secret
    subject_world(spark, kafka, topic, mutation_topic, lake, checkpoints)
    early = retain(
        spark,
        kafka,
        lake,
        checkpoints,
        gdpr_topic,
        [gdpr("e0", A, ERASURE, subject_id=LEAD, at="2031-01-01T00:00:00Z")],
    )
    assert early.requests_quarantined == 1, (
        "a request from the future is refused, and kept raw with the id until the erasure"
    )
    erased = retain(
        spark,
        kafka,
        lake,
        checkpoints,
        gdpr_topic,
        [
            gdpr("e1", A, ERASURE, subject_id=LEAD),
            gdpr("e2", A, ERASURE, subject_id=CONTACT, at="2026-02-01T11:00:00Z"),
        ],
    )
    assert erased.erasure_requests == 2 and erased.bytes_removed > 0 and erased.bytes_written > 0
    suppressed = load_suppressed(lake, ENGAGEMENT_ERASED_SUBJECTS, secret)
    assert suppressed.pairs() == {(A, subject_hash(secret, A, LEAD)), (A, subject_hash(secret, A, CONTACT))}

    # -- everything of the subject that arrives later is dropped and counted by hash, stored nowhere
    produce(
        kafka,
        topic,
        [
            activity("a1", A, DAY, lead=LEAD),  # a producer retry of an erased record
            activity("n1", A, DAY, lead=LEAD),
            activity("n2", A, DAY, contact=CONTACT),  # late events, a replay
            {**activity("q2", A, DAY, contact=CONTACT), "event_time": "yesterday"},  # bad, and naming the subject
            activity("n3", A, DAY, lead=KEPT),
        ],
    )
    late = ingest(spark, kafka, lake, checkpoints, topic)
    assert (late.records_read, late.rows_appended, late.records_suppressed) == (5, 1, 4)
    mutated = mutate(
        spark,
        kafka,
        lake,
        checkpoints,
        mutation_topic,
        [
            request(
                "m4", "convert", from_field="lead_id", from_id=KEPT, to_field="lead_id", to_id=LEAD
            ),  # into the erased id
            request("m5", "merge", field="contact_id", from_ids=["003SOMEONE1"], to_id=CONTACT),
            {
                **request("m6", "convert", from_field="lead_id", from_id=LEAD),
                "to_field": 7,
            },  # malformed, naming the subject
            request("m7", "update", engagement_id="a4", record={"lead_id": KEPT, "subject": "follow-up"}),
        ],
    )
    assert (mutated.requests_read, mutated.requests_suppressed, mutated.requests_applied) == (4, 3, 1)
    again = retain(
        spark, kafka, lake, checkpoints, gdpr_topic, [gdpr("e1", A, ERASURE, subject_id=LEAD)]
    )  # a repeated request
    assert (again.requests_applied, again.requests_quarantined, again.requests_suppressed) == (0, 0, 1)

    assert rows_naming(lake, suppressed) == {t: 0 for t in VACUUMED_TABLES}
    assert sorted(r["engagement_id"] for r in rows_of(lake, A)) == ["a4", "n3"]
    counts = {
        (r["stream"], r["subject_hash"]): r["records"]
        for r in lake.read(ENGAGEMENT_SUPPRESSED_RECORDS.name).to_pylist()
    }
    lead_hash, contact_hash = subject_hash(secret, A, LEAD), subject_hash(secret, A, CONTACT)
    assert counts == {
        ("ingestion", lead_hash): 2,
        ("ingestion", contact_hash): 2,
        ("mutation", lead_hash): 2,
        ("mutation", contact_hash): 1,
        ("retention", lead_hash): 1,
    }
    for name in (
        GDPR_AUDIT.name,
        QUARANTINE_ENGAGEMENT_GDPR.name,
        QUARANTINE_ENGAGEMENT_INGESTION.name,
        QUARANTINE_ENGAGEMENT_MUTATIONS.name,
        ENGAGEMENT_MUTATION_REQUESTS.name,
        ENGAGEMENT_MUTATIONS_PENDING.name,
    ):
        if lake.exists(name):
            text = json.dumps(lake.read(name).to_pylist(), default=str)
            assert LEAD not in text and CONTACT not in text, name

    # -- the window: until upkeep, removed files and old log entries still hold the ids; after it, no byte does
    root = Path(lake_root)
    assert files_holding(root, (LEAD, CONTACT)), "deletes only tombstone files: the ids are still on disk"
    time.sleep(WINDOW_S / 2 + 1)
    out = materialize([engagement_layout_upkeep], resources={"lake": LakeResource(root=lake_root)})
    assert out.success
    metadata = out.asset_materializations_for_node("engagement_layout_upkeep")[0].metadata
    assert metadata["logs_expired"].value >= 3 and metadata["log_expiry_conflicts"].value == 0
    assert metadata["quarantined_requests_purged"].value == 0, "the erasure batch purged the refused request already"
    left = files_holding(root, (LEAD, CONTACT))
    assert left == [], (
        left,
        {p: sorted(x.name for x in (root / p.split("/")[0] / "_delta_log").iterdir()) for p in left},
    )
    assert files_holding(root, (KEPT,)), "other people's data stays"
    assert sorted(r["engagement_id"] for r in rows_of(lake, A)) == ["a4", "n3"] and [
        r["engagement_id"] for r in rows_of(lake, B)
    ] == ["b1"]

    # -- a consumer that lags beyond the window gets a clear error, one that kept up reads on
    with pytest.raises(ChangesExpired, match="no longer kept.*EP_ERASURE_WINDOW.*Re-read the org in full"):
        changes_since(lake, ENGAGEMENT_NOTIFICATIONS, ENGAGEMENT_ACTIVITY.name, A, START)
    current = lake.table(ENGAGEMENT_NOTIFICATIONS.name).version()
    assert changes_since(lake, ENGAGEMENT_NOTIFICATIONS, ENGAGEMENT_ACTIVITY.name, A, current).rows.num_rows == 0

    # -- every table still reads, with deltalake and with an independent reader
    tables = sorted(p.parent for p in root.rglob("_delta_log"))
    assert len(tables) >= 10
    for folder in tables:
        rows = DeltaTable(str(folder)).to_pyarrow_table()
        columns = [f.name for f in rows.schema if not str(f.type).startswith(("list", "struct", "map"))]
        assert same_rows(rows, str(folder), columns), folder.name


def test_an_erasure_removes_the_rows_a_landing_pipeline_stored_before_it(
    spark, kafka, gdpr_topic, lake, lake_root, checkpoints, tmp_path, monkeypatch
):
    """A pipeline whose records name people (its `suppression:` section names this lake's list): the rows
    and quarantined records it stored before the erasure go with it; other members stay."""
    data = yaml.safe_load((REPO / "pipelines" / "rewards_members.yaml").read_text())
    data["suppression"] = {
        "list_table": ENGAGEMENT_ERASED_SUBJECTS.name,
        "scope": A,
        "subject_columns": ["member_id", "email"],
    }
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    (pipelines / "rewards_members.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.setenv("EP_PIPELINES_DIR", str(pipelines))
    config = load_pipelines(pipelines)[0]
    landed = tmp_path / "members.csv"
    landed.write_text(
        "id,name,bday,level,email,points\n1,Ann Lee,01/02/1990,G,ann@example.com,10\n"
        "2,Bob Ray,1985-03-04,silver,bob@example.com,20\n3,Cy Bo,1985-03-04,silver,bob@example.com,lots\n"
    )
    plan = file_plan(config, 1, str(landed), landed.stat().st_size)
    assert checkpoints.record_plan(plan)
    assert run_file_batch(spark, lake, checkpoints, config, plan).rows_written == 2

    result = retain(spark, kafka, lake, checkpoints, gdpr_topic, [gdpr("e1", A, ERASURE, subject_id="bob@example.com")])
    assert lake.read(config.target.table)["member_id"].to_pylist() == [1]
    assert lake.read(config.target.quarantine_table).num_rows == 0, "the rejected record naming the subject went too"
    assert (result.rows_removed[config.target.table], result.rows_removed[config.target.quarantine_table]) == (1, 1)
    history = json.dumps(lake.table(config.target.table).history(), default=str)
    assert "bob@example.com" not in history, "the target's rows went by file rewrite: no predicate in the log"
