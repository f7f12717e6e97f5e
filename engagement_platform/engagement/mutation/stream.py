"""The mutation stream as the platform knows it (registry.py): its Dagster parts, settings, tables and run-batch."""

from engagement_platform.engagement.mutation.apply import SPEC
from engagement_platform.engagement.mutation.tables import (
    ENGAGEMENT_MUTATION_REQUESTS,
    ENGAGEMENT_MUTATIONS_PENDING,
    QUARANTINE_ENGAGEMENT_MUTATIONS,
)
from engagement_platform.engagement.tables import (
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_ACTIVITY_CHANGES,
    ENGAGEMENT_NOTIFICATIONS,
    ENGAGEMENT_SUPPRESSED_RECORDS,
)
from engagement_platform.streams.by_hand import stored_batch
from engagement_platform.streams.definition import StreamDefinition


def dagster_parts():
    from engagement_platform.engagement.mutation.assets import MUTATION  # Dagster: loaded with the Definitions

    return MUTATION


DEFINITION = StreamDefinition(
    name=SPEC.name,
    parts=dagster_parts,
    spec=SPEC,
    run_batch=stored_batch(SPEC),
    settings_section="mutation",
    tables=(
        ENGAGEMENT_MUTATION_REQUESTS,
        ENGAGEMENT_ACTIVITY,
        ENGAGEMENT_ACTIVITY_CHANGES,
        ENGAGEMENT_MUTATIONS_PENDING,
        QUARANTINE_ENGAGEMENT_MUTATIONS,
        ENGAGEMENT_SUPPRESSED_RECORDS,
        ENGAGEMENT_NOTIFICATIONS,
    ),
)
