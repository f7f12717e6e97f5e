"""Asset surface of the engagement activity lake: its group, the stream asset keys, and its tables.

Several streams write the same Delta tables, and an asset key has one producer in Dagster. So each
stream is its own partitioned asset (one partition per committed batch: ingestion/, mutation/,
retention/ each build theirs with the Kafka stream factory), and the tables are downstream assets whose
materializations the stream runs report (table version, rows). The lineage graph reads: Kafka topic ->
stream -> tables, and gains a stream node per stream.
"""

from dagster import AssetKey, AssetSpec

from engagement_platform.engagement.mutation.tables import (
    ENGAGEMENT_MUTATION_REQUESTS,
    ENGAGEMENT_MUTATIONS_PENDING,
    QUARANTINE_ENGAGEMENT_MUTATIONS,
)
from engagement_platform.engagement.retention.tables import GDPR_AUDIT, QUARANTINE_ENGAGEMENT_GDPR
from engagement_platform.engagement.tables import (
    ENGAGEMENT_ACTIVITY,
    ENGAGEMENT_ACTIVITY_CHANGES,
    ENGAGEMENT_ERASED_SUBJECTS,
    ENGAGEMENT_NOTIFICATIONS,
    ENGAGEMENT_SUPPRESSED_RECORDS,
    QUARANTINE_ENGAGEMENT_INGESTION,
)
from engagement_platform.lake.checkpoints import CHECKPOINTS
from engagement_platform.lake.delta import TableSpec
from engagement_platform.orchestration.parts import Parts

GROUP = "engagement"
# Writers that rewrite engagement_activity files (mutation rewrites, retention deletes, layout upkeep) would
# fail each other's commits when run together; dagster.yaml limits this pool to one at a time.
REWRITE_POOL = "engagement_activity_rewrites"
INGESTION_ASSET = AssetKey("engagement_ingestion")
MUTATION_ASSET = AssetKey("engagement_mutation")
RETENTION_ASSET = AssetKey("engagement_retention")


def table_spec(spec: TableSpec, writers: list[AssetKey], description: str) -> AssetSpec:
    return AssetSpec(
        key=spec.name,
        deps=writers,
        group_name=GROUP,
        description=description,
        kinds={"deltalake"},
        metadata={"partitioned_by": ", ".join(spec.partition_by) or "-", "change_data_feed": spec.change_data_feed},
    )


ALL = [INGESTION_ASSET, MUTATION_ASSET, RETENTION_ASSET]
engagement_tables = [
    table_spec(
        ENGAGEMENT_ACTIVITY, ALL, "One row per engagement activity, partitioned by org, clustered by engagement date."
    ),
    table_spec(
        ENGAGEMENT_NOTIFICATIONS,
        ALL,
        "Per org and batch: rows inserted/updated/deleted in a table, for incremental readers.",
    ),
    table_spec(
        ENGAGEMENT_ACTIVITY_CHANGES,
        [MUTATION_ASSET, RETENTION_ASSET],
        "Row-level changes (_change_type, _commit_version) of the engagement_activity commits the mutation stream makes "
        "without change-data files; erasure and TTL delete from it too.",
    ),
    table_spec(
        QUARANTINE_ENGAGEMENT_INGESTION,
        [INGESTION_ASSET, RETENTION_ASSET],
        "Records that could not be ingested, with raw bytes, source offset and reason.",
    ),
    table_spec(CHECKPOINTS, ALL, "Batch plans (offset ranges) and per-process state of every stream."),
    table_spec(
        ENGAGEMENT_MUTATION_REQUESTS,
        [MUTATION_ASSET, RETENTION_ASSET],
        "Every valid ID mutation request, as received, partitioned by org and request date.",
    ),
    table_spec(
        ENGAGEMENT_MUTATIONS_PENDING,
        [MUTATION_ASSET, RETENTION_ASSET],
        "Requests whose targets are not in engagement_activity yet, retried until their horizon.",
    ),
    table_spec(
        QUARANTINE_ENGAGEMENT_MUTATIONS,
        [MUTATION_ASSET, RETENTION_ASSET],
        "Malformed requests and requests whose target never arrived, with reason.",
    ),
    table_spec(
        GDPR_AUDIT,
        [RETENTION_ASSET],
        "One row per applied retention or erasure request: received, completed, rows removed per table; an "
        "erasure's subject only as its keyed hash.",
    ),
    table_spec(
        QUARANTINE_ENGAGEMENT_GDPR,
        [RETENTION_ASSET],
        "Retention / erasure requests that are malformed or repeated, with raw request and reason.",
    ),
    table_spec(
        ENGAGEMENT_ERASED_SUBJECTS,
        [RETENTION_ASSET],
        "The suppression list: each erased subject's keyed hash per org; every stream drops their records.",
    ),
    table_spec(
        ENGAGEMENT_SUPPRESSED_RECORDS,
        ALL,
        "Per batch: records dropped because they named an erased subject (hash and count, never the record).",
    ),
]
ENGAGEMENT_TABLES = Parts(assets=engagement_tables)
