"""The ingestion stream as the platform knows it (registry.py): its Dagster parts, settings, tables and run-batch."""

from engagement_platform.engagement.ingestion.apply import SPEC
from engagement_platform.engagement.tables import (
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_NOTIFICATIONS,
    ENGAGEMENT_SUPPRESSED_RECORDS,
    QUARANTINE_ENGAGEMENT_INGESTION,
)
from engagement_platform.streams.by_hand import stored_batch
from engagement_platform.streams.definition import StreamDefinition


def dagster_parts():
    from engagement_platform.engagement.ingestion.assets import INGESTION  # Dagster: loaded with the Definitions

    return INGESTION


DEFINITION = StreamDefinition(
    name=SPEC.name,
    parts=dagster_parts,
    spec=SPEC,
    run_batch=stored_batch(SPEC),
    settings_section="ingestion",
    tables=(
        ENGAGEMENT_ACTIVITY,
        QUARANTINE_ENGAGEMENT_INGESTION,
        ENGAGEMENT_SUPPRESSED_RECORDS,
        ENGAGEMENT_NOTIFICATIONS,
    ),
)
