import shutil

from dagster import AssetKey, DagsterInstance

from engagement_platform.definitions import defs
from engagement_platform_tests.support.stack import REPO


def lineage_parents(repo, key: str) -> set:
    return set(repo.asset_graph.get(AssetKey(key)).parent_keys)


def test_definitions_load_and_list_every_asset_check_sensor_and_job():
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == {
        "kafka/engagement_activities",
        "engagement_ingestion",
        "engagement_activity",
        "engagement_notifications",
        "engagement_activity_changes",
        "quarantine_engagement_ingestion",
        "checkpoints",
        "kafka/engagement_mutations",
        "engagement_mutation",
        "engagement_mutation_requests",
        "engagement_mutations_pending",
        "quarantine_engagement_mutations",
        "engagement_layout_upkeep",
        "kafka/engagement_gdpr",
        "engagement_retention",
        "gdpr_audit",
        "quarantine_engagement_gdpr",
        "engagement_erased_subjects",
        "engagement_suppressed_records",
        # pipelines/rewards_members.yaml
        "landing/rewards_members",
        "ingest_rewards_members",
        "rewards_members",
        "quarantine_rewards_members",
        "landing_retention",
        "kafka/profile_cdc",
        "profile_cdc_staging",
        "profile_raw",
        "profile_backfill",
        "profile_progress",
        "quarantine_profile_cdc",
        "kafka/profile_erasure",
        "profile_erasure",
        "profile_erased_subjects",
        "profile_suppressed_records",
        "profile_erasure_audit",
        "quarantine_profile_erasure",
        "profile_lake_upkeep",
        "profile_segments",
        "profile_segments_compaction",
        "engagement_daily_metrics",  # the example consumer of changes_since
    }
    checks = {(c.asset_key.to_user_string(), c.name) for c in repo.asset_graph.asset_check_keys}
    assert checks == {
        ("engagement_ingestion", n)
        for n in (
            "no_duplicate_engagement_ids",
            "notifications_match_changes",
            "offset_ranges_contiguous",
            "records_conserved",
        )
    } | {
        ("engagement_mutation", n)
        for n in (
            "no_duplicate_engagement_ids",
            "notifications_match_changes",
            "offset_ranges_contiguous",
            "requests_accounted",
        )
    } | {
        ("engagement_retention", n)
        for n in (
            "subject_erased_everywhere",
            "notifications_match_changes",
            "offset_ranges_contiguous",
            "requests_accounted",
        )
    } | {("ingest_rewards_members", n) for n in ("records_conserved", "error_rate_under_threshold")} | {
        ("engagement_layout_upkeep", n) for n in ("date_ranges_do_not_overlap", "file_count_under_limit")
    } | {
        ("profile_cdc_staging", "records_accounted"),
        ("profile_cdc_staging", "offset_ranges_contiguous"),
        ("profile_raw", "replication_lag_under_threshold"),
        ("profile_raw", "no_duplicate_primary_ids"),
        ("profile_progress", "every_tenant_replication_lag_under_threshold"),
    } | {
        ("profile_erasure", n) for n in ("identity_erased_everywhere", "requests_accounted", "offset_ranges_contiguous")
    } | {("profile_segments", "membership_matches_reference")} | {
        ("profile_segments_compaction", "base_equals_merged_membership")
    } | {("engagement_daily_metrics", "daily_metrics_equal_full_recomputation")}
    # Checks run after the batch's tables are committed: audits, so none is declared blocking.
    assert not [(a.key, c.name) for a in set(repo.assets_defs_by_key.values()) for c in a.check_specs if c.blocking]
    assert {s.name for s in repo.sensor_defs} == {
        "engagement_ingestion_sensor",
        "engagement_mutation_sensor",
        "engagement_retention_sensor",
        "layout_upkeep_sensor",
        "ingest_rewards_members_landing_sensor",
        "profile_cdc_dumper_sensor",
        "profile_processor_sensor",
        "profile_lag_sensor",
        "profile_erasure_sensor",
        "profile_segments_sensor",
        "profile_segments_compaction_sensor",
        "engagement_daily_metrics_sensor",
    }
    assert {AssetKey("engagement_activity"), AssetKey("engagement_notifications")} == lineage_parents(
        repo, "engagement_daily_metrics"
    )
    assert {s.name for s in repo.schedule_defs} == {
        "layout_upkeep_schedule",
        "profile_upkeep_schedule",
        "landing_retention_schedule",
        "profile_segments_compaction_schedule",
    }
    assert {
        "engagement_ingestion_job",
        "engagement_mutation_job",
        "engagement_retention_job",
        "layout_upkeep_job",
        "ingest_rewards_members_job",
        "profile_cdc_staging_job",
        "profile_processor_job",
        "profile_backfill_job",
        "profile_segments_compaction_job",
    } <= set(repo.job_names)
    # a processor run merges a tenant's changes and evaluates its segments in one process
    assert repo.get_job("profile_processor_job").asset_layer.executable_asset_keys == {
        AssetKey("profile_raw"),
        AssetKey("profile_segments"),
    }
    assert repo.assets_defs_by_key[AssetKey("engagement_mutation")].op.pool == "engagement_activity_rewrites"
    assert repo.assets_defs_by_key[AssetKey("engagement_layout_upkeep")].op.pool == "engagement_activity_rewrites"
    assert repo.assets_defs_by_key[AssetKey("engagement_retention")].op.pool == "engagement_activity_rewrites"
    lineage = repo.asset_graph
    assert AssetKey("engagement_ingestion") in lineage.get(AssetKey("engagement_activity")).parent_keys
    assert AssetKey(["kafka", "engagement_activities"]) in lineage.get(AssetKey("engagement_ingestion")).parent_keys
    assert AssetKey("engagement_mutation") in lineage.get(AssetKey("engagement_activity")).parent_keys
    assert {AssetKey("engagement_mutation"), AssetKey("engagement_retention")} == lineage.get(
        AssetKey("engagement_activity_changes")
    ).parent_keys
    assert AssetKey(["kafka", "engagement_mutations"]) in lineage.get(AssetKey("engagement_mutation")).parent_keys
    for table in (
        "engagement_activity",
        "engagement_notifications",
        "checkpoints",
        "engagement_mutations_pending",
        "engagement_mutation_requests",
        "quarantine_engagement_mutations",
        "quarantine_engagement_ingestion",
        "gdpr_audit",
    ):
        assert AssetKey("engagement_retention") in lineage.get(AssetKey(table)).parent_keys, table
    assert AssetKey(["kafka", "engagement_gdpr"]) in lineage.get(AssetKey("engagement_retention")).parent_keys
    assert AssetKey(["landing", "rewards_members"]) in lineage.get(AssetKey("ingest_rewards_members")).parent_keys
    assert AssetKey("ingest_rewards_members") in lineage.get(AssetKey("quarantine_rewards_members")).parent_keys
    assert AssetKey(["kafka", "profile_cdc"]) in lineage.get(AssetKey("profile_cdc_staging")).parent_keys
    assert {AssetKey("profile_cdc_staging"), AssetKey("profile_backfill")} <= lineage.get(
        AssetKey("profile_raw")
    ).parent_keys


def test_the_instance_evaluates_sensors_on_threads_of_their_own(tmp_path):
    """dagster.yaml (copied into DAGSTER_HOME by run_platform.sh and the soak) lets a sensor whose tick waits on a
    service that is away (up to 20 s while ZooKeeper restarts) delay only its own stream: serially, every other
    stream's tick waits behind it (a sensor due every 5 s ticks every 40 s at p90 under ZooKeeper restarts)."""
    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        settings = instance.get_settings("sensors")
    assert settings["use_threads"] is True
    assert settings["num_workers"] > 1  # one thread would evaluate them one after another again


def test_every_kafka_stream_sensor_ticks_within_seconds_whatever_its_cadence():
    """A stream's tick skips while its lock is held, and a failed batch is retried by a later tick: the retention
    stream ticking every 60 s planned a batch due at 1,132 s at 1,257 s, two ticks having found the lock
    held. Its cadence (EP_RETENTION_INTERVAL_SECONDS, daily by default) is its tick gate's."""
    streams = {
        "engagement_ingestion_sensor",
        "engagement_mutation_sensor",
        "engagement_retention_sensor",
        "profile_cdc_dumper_sensor",
        "profile_erasure_sensor",
    }
    intervals = {s.name: s.minimum_interval_seconds for s in defs.get_repository_def().sensor_defs if s.name in streams}
    assert intervals.keys() == streams and max(intervals.values()) <= 10, intervals
