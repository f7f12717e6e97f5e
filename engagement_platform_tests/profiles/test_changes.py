"""The incremental API: what changed for a tenant between two times, from the staging table."""

from datetime import UTC, datetime

from engagement_platform.profiles.changes import tenant_changes
from engagement_platform_tests.support.cdc import new_topic, record, stage


def at(hh_mm: str) -> datetime:
    return datetime.fromisoformat(f"2026-01-05T{hh_mm}:00").replace(tzinfo=UTC)


def test_changes_between_two_times_per_tenant(spark, kafka, lake, checkpoints):
    topic = new_topic(kafka)
    stage(
        spark,
        kafka,
        lake,
        checkpoints,
        topic,
        [
            record("acme", "1", 1, {"a": 1}, ts="2026-01-05T10:01:00Z"),
            record("acme", "1", 4, {"a": 2}, ts="2026-01-05T10:20:00Z"),
            record("acme", "2", 3, {"b": 1}, ts="2026-01-05T10:16:00Z"),
            record("acme", "3", 5, {}, ts="2026-01-05T10:45:00Z"),
            record("globex", "1", 2, {}, ts="2026-01-05T10:17:00Z"),
        ],
    )
    window = tenant_changes(lake, "acme", at("10:15"), at("10:45"))
    assert [(r["primary_id"], r["cdc_seq"]) for r in window.to_pylist()] == [("2", 3), ("1", 4)]
    everything = tenant_changes(lake, "acme", at("10:00"), at("11:00"))
    assert [r["cdc_seq"] for r in everything.to_pylist()] == [1, 3, 4, 5]
    latest = tenant_changes(lake, "acme", at("10:00"), at("11:00"), latest_only=True)
    assert [(r["primary_id"], r["cdc_seq"]) for r in latest.to_pylist()] == [("2", 3), ("1", 4), ("3", 5)]
    assert tenant_changes(lake, "globex", at("10:00"), at("10:15")).num_rows == 0
    assert tenant_changes(lake, "initech", at("10:00"), at("11:00")).num_rows == 0
