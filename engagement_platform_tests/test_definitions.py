from dagster import AssetKey

from engagement_platform.definitions import defs


def test_definitions_load_and_list_every_asset_check_sensor_and_job():
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == {
        "kafka/engagement_activities", "engagement_ingestion", "engagement_activity",
        "engagement_notifications", "quarantine_engagement_ingestion", "checkpoints",
    }
    checks = {(c.asset_key.to_user_string(), c.name) for c in repo.asset_graph.asset_check_keys}
    assert checks == {("engagement_ingestion", n) for n in (
        "no_duplicate_engagement_ids", "notifications_match_changes", "offset_ranges_contiguous", "records_conserved")}
    assert {s.name for s in repo.sensor_defs} == {"engagement_ingestion_sensor"}
    assert "engagement_ingestion_job" in repo.job_names
    lineage = repo.asset_graph
    assert AssetKey("engagement_ingestion") in lineage.get(AssetKey("engagement_activity")).parent_keys
    assert AssetKey(["kafka", "engagement_activities"]) in lineage.get(AssetKey("engagement_ingestion")).parent_keys
