"""The CDC dumper as the platform knows it (registry.py): its Dagster parts, settings, tables and run-batch."""

from engagement_platform.profiles.staging.apply import SPEC
from engagement_platform.profiles.tables import PROFILE_CDC_STAGING, PROFILE_SUPPRESSED_RECORDS, QUARANTINE_PROFILE_CDC
from engagement_platform.streams.by_hand import stored_batch
from engagement_platform.streams.definition import StreamDefinition


def dagster_parts():
    from engagement_platform.profiles.staging.assets import PROFILE_CDC  # Dagster: loaded with the Definitions

    return PROFILE_CDC


DEFINITION = StreamDefinition(
    name=SPEC.name,
    parts=dagster_parts,
    spec=SPEC,
    run_batch=stored_batch(SPEC),
    settings_section="profiles",
    tables=(PROFILE_CDC_STAGING, QUARANTINE_PROFILE_CDC, PROFILE_SUPPRESSED_RECORDS),
)
