"""Profile erasure as the platform knows it (registry.py): its Dagster parts (with the profile lake's
upkeep), settings, tables and run-batch. Besides these tables it deletes from each tenant's raw table
(profile_raw's partition) and from the landing pipelines whose records name profiles."""

from engagement_platform.profiles.erasure.apply import SPEC
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS
from engagement_platform.profiles.tables import (
    PROFILE_CDC_STAGING,
    PROFILE_ERASED_SUBJECTS,
    PROFILE_ERASURE_AUDIT,
    PROFILE_SUPPRESSED_RECORDS,
    QUARANTINE_PROFILE_CDC,
    QUARANTINE_PROFILE_ERASURE,
)
from engagement_platform.streams.by_hand import stored_batch
from engagement_platform.streams.definition import StreamDefinition


def dagster_parts():
    from engagement_platform.profiles.erasure.assets import ERASURE  # Dagster: loaded with the Definitions

    return ERASURE


DEFINITION = StreamDefinition(
    name=SPEC.name,
    parts=dagster_parts,
    spec=SPEC,
    run_batch=stored_batch(SPEC),
    settings_section="profiles",
    tables=(
        QUARANTINE_PROFILE_ERASURE,
        PROFILE_ERASED_SUBJECTS,
        PROFILE_CDC_STAGING,
        QUARANTINE_PROFILE_CDC,
        PROFILE_SEGMENTS,
        PROFILE_SEGMENT_CHANGES,
        PROFILE_SUPPRESSED_RECORDS,
        PROFILE_ERASURE_AUDIT,
    ),
    asset="profile_erasure",
)
