"""The retention stream as the platform knows it (registry.py): its Dagster parts, settings, tables and run-batch.

Its tables are those its batches commit whatever the requests; an erasure also deletes from the landing
pipelines whose records name the lake's people (their `suppression:` section), which are theirs to list.
"""

from engagement_platform.engagement.retention.apply import SPEC
from engagement_platform.engagement.retention.erasure import ERASABLE
from engagement_platform.engagement.retention.tables import GDPR_AUDIT, QUARANTINE_ENGAGEMENT_GDPR
from engagement_platform.engagement.tables import (
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_ACTIVITY_CHANGES,
    ENGAGEMENT_ERASED_SUBJECTS,
    ENGAGEMENT_NOTIFICATIONS,
    ENGAGEMENT_SUPPRESSED_RECORDS,
)
from engagement_platform.streams.by_hand import stored_batch
from engagement_platform.streams.definition import StreamDefinition


def dagster_parts():
    from engagement_platform.engagement.retention.assets import RETENTION  # Dagster: loaded with the Definitions

    return RETENTION


DEFINITION = StreamDefinition(
    name=SPEC.name,
    parts=dagster_parts,
    spec=SPEC,
    run_batch=stored_batch(SPEC),
    settings_section="retention",
    tables=(
        QUARANTINE_ENGAGEMENT_GDPR,
        ENGAGEMENT_ERASED_SUBJECTS,
        ENGAGEMENT_SUPPRESSED_RECORDS,
        ENGAGEMENT_ACTIVITY,
        ENGAGEMENT_ACTIVITY_CHANGES,
        *(erasable.spec for erasable in ERASABLE),
        ENGAGEMENT_NOTIFICATIONS,
        GDPR_AUDIT,
    ),
)
