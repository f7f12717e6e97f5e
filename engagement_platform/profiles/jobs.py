"""Jobs of the profile CDC lake, run in-process (Spark is a long-lived Connect server)."""

from dagster import AssetSelection, define_asset_job, in_process_executor

from engagement_platform.orchestration.runs import STREAM_TAG
from engagement_platform.profiles.assets import BACKFILL_ASSET, RAW_ASSET, STAGING_ASSET
from engagement_platform.profiles.partitions import profile_cdc_batches, profile_tenants
from engagement_platform.profiles.staging.apply import STREAM

profile_cdc_staging_job = define_asset_job(
    "profile_cdc_staging_job",
    selection=AssetSelection.assets(STAGING_ASSET),
    partitions_def=profile_cdc_batches,
    executor_def=in_process_executor,
    tags={STREAM_TAG: STREAM},
    description="Stage one planned slice of profile.cdc (append to profile_cdc_staging, quarantine the bad records).",
)

# Runs carry STREAM_TAG = profile_processor/<tenant> (from the sensor): one run per tenant at a time.
profile_processor_job = define_asset_job(
    "profile_processor_job",
    selection=AssetSelection.assets(RAW_ASSET),
    partitions_def=profile_tenants,
    executor_def=in_process_executor,
    description="Merge a tenant's staged CDC changes into its raw table, under the tenant lock.",
)

profile_backfill_job = define_asset_job(
    "profile_backfill_job",
    selection=AssetSelection.assets(BACKFILL_ASSET),
    partitions_def=profile_tenants,
    executor_def=in_process_executor,
    description="Load a hot-store snapshot export (path, time boundary in the run config) into a tenant's raw table, under the tenant lock.",
)
