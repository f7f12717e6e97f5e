"""Assets of the engagement activity lake.

Several streams write the same Delta tables, and an asset key has one producer in Dagster. So each
stream is its own partitioned asset (one partition per committed batch), and the tables are
downstream assets whose materializations the stream runs report (table version, rows). The lineage
graph reads: Kafka topic -> stream -> tables, and gains a stream node per stream.
"""


from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetSpec,
    DataVersion,
    MaterializeResult,
    ObserveResult,
    asset,
    observable_source_asset,
)

from engagement_platform.orchestration.runs import coordinated_batch, report_table_commits
from engagement_platform.engagement.mutation import apply as mutations
from engagement_platform.engagement.retention import apply as retention
from engagement_platform.engagement.checks import evaluate_ingestion_checks, evaluate_mutation_checks, ingestion_check_specs, mutation_check_specs
from engagement_platform.engagement.checks import evaluate_retention_checks, retention_check_specs
from engagement_platform.engagement.ingestion.apply import STREAM, ingest_batch
from engagement_platform.engagement.mutation.tables import (
    ENGAGEMENT_MUTATION_REQUESTS,
    ENGAGEMENT_MUTATIONS_PENDING,
    QUARANTINE_ENGAGEMENT_MUTATIONS,
)
from engagement_platform.engagement.partitions import ingestion_batches, mutation_batches, retention_batches
from engagement_platform.engagement.retention.tables import GDPR_AUDIT, QUARANTINE_ENGAGEMENT_GDPR
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_NOTIFICATIONS, QUARANTINE_ENGAGEMENT_INGESTION
from engagement_platform.lake.checkpoints import CHECKPOINTS
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource
from engagement_platform.settings import load_settings

GROUP = "engagement"
# Writers that rewrite engagement_activity files (mutation MERGE, layout upkeep) would fail each
# other's commits when run together; dagster.yaml limits this pool to one at a time.
REWRITE_POOL = "engagement_activity_rewrites"
INGESTION_ASSET = AssetKey("engagement_ingestion")
TOPIC_ASSET = AssetKey(["kafka", "engagement_activities"])
MUTATION_ASSET = AssetKey("engagement_mutation")
MUTATIONS_TOPIC_ASSET = AssetKey(["kafka", "engagement_mutations"])
RETENTION_ASSET = AssetKey("engagement_retention")
GDPR_TOPIC_ASSET = AssetKey(["kafka", "engagement_gdpr"])


def watermark_metadata(watermarks: dict[int, tuple[int, int]]) -> dict:
    return {
        "messages_total": sum(h for _, h in watermarks.values()),
        **{f"partition_{p}_high": h for p, (_, h) in sorted(watermarks.items())},
        **{f"partition_{p}_low": lo for p, (lo, _) in sorted(watermarks.items())},
    }


def topic_observation(watermarks: dict[int, tuple[int, int]], key: AssetKey = TOPIC_ASSET) -> AssetObservation:
    """What a stream's sensor reports on every tick that reads the watermarks."""
    return AssetObservation(asset_key=key, metadata=watermark_metadata(watermarks))


@observable_source_asset(key=TOPIC_ASSET, group_name=GROUP, description="Kafka topic of engagement activities from the sales apps (EP_ACTIVITIES_TOPIC).")
def engagement_activities_topic(kafka: KafkaResource) -> ObserveResult:
    marks = kafka.client.watermarks(load_settings().ingestion.topic)
    return ObserveResult(data_version=DataVersion(str(sum(h for _, h in marks.values()))), metadata=watermark_metadata(marks))


@asset(
    key=INGESTION_ASSET,
    deps=[TOPIC_ASSET],
    partitions_def=ingestion_batches,
    check_specs=ingestion_check_specs(INGESTION_ASSET),
    group_name=GROUP,
    kinds={"spark", "deltalake", "kafka"},
)
def engagement_ingestion(context: AssetExecutionContext, spark: SparkResource, lake: LakeResource, kafka: KafkaResource,
                         coordinator: CoordinatorResource) -> MaterializeResult:
    """Ingestion stream: each partition is one planned Kafka offset slice, appended exactly once."""
    plan = coordinator.checkpoints.plan(STREAM, int(context.partition_key))
    with coordinated_batch(context, coordinator, STREAM):  # lock + predecessor, fenced commits, unlock
        result = ingest_batch(spark.spark_session, lake.lake, coordinator.checkpoints, kafka.servers, plan)
    report_table_commits(context, STREAM, plan.batch_id, result.versions)
    return MaterializeResult(
        metadata=result.metadata(),
        check_results=evaluate_ingestion_checks(lake.lake, coordinator.checkpoints, result, result.org_ids),
    )


@observable_source_asset(key=MUTATIONS_TOPIC_ASSET, group_name=GROUP, description="Kafka topic of ID mutation requests: convert, merge, delete, update (EP_MUTATIONS_TOPIC).")
def engagement_mutations_topic(kafka: KafkaResource) -> ObserveResult:
    marks = kafka.client.watermarks(mutations.mutations_topic())
    return ObserveResult(data_version=DataVersion(str(sum(h for _, h in marks.values()))), metadata=watermark_metadata(marks))


@asset(
    key=MUTATION_ASSET,
    deps=[MUTATIONS_TOPIC_ASSET],
    partitions_def=mutation_batches,
    check_specs=mutation_check_specs(MUTATION_ASSET),
    group_name=GROUP,
    kinds={"deltalake", "kafka"},
    pool=REWRITE_POOL,
)
def engagement_mutation(context: AssetExecutionContext, spark: SparkResource, lake: LakeResource, kafka: KafkaResource,
                        coordinator: CoordinatorResource) -> MaterializeResult:
    """Mutation stream: each partition is one planned slice of requests, reduced (cascades) and
    applied as one MERGE exactly once; requests whose targets are not ingested yet wait in pending."""
    plan = coordinator.checkpoints.plan(mutations.STREAM, int(context.partition_key))
    with coordinated_batch(context, coordinator, mutations.STREAM):  # lock + predecessor, fenced commits, unlock
        result = mutations.apply_mutation_batch(spark.spark_session, lake.lake, coordinator.checkpoints, kafka.servers, plan)
    report_table_commits(context, mutations.STREAM, plan.batch_id, result.versions)
    return MaterializeResult(metadata=result.metadata(), check_results=evaluate_mutation_checks(lake.lake, coordinator.checkpoints, result))


@observable_source_asset(key=GDPR_TOPIC_ASSET, group_name=GROUP, description="Kafka topic of TTL / GDPR requests: org retention and subject erasure (EP_GDPR_TOPIC).")
def engagement_gdpr_topic(kafka: KafkaResource) -> ObserveResult:
    marks = kafka.client.watermarks(retention.gdpr_topic())
    return ObserveResult(data_version=DataVersion(str(sum(h for _, h in marks.values()))), metadata=watermark_metadata(marks))


@asset(
    key=RETENTION_ASSET,
    deps=[GDPR_TOPIC_ASSET],
    partitions_def=retention_batches,
    check_specs=retention_check_specs(RETENTION_ASSET),
    group_name=GROUP,
    kinds={"deltalake", "kafka"},
    pool=REWRITE_POOL,  # its deletes rewrite engagement_activity files, like the mutation MERGE
)
def engagement_retention(context: AssetExecutionContext, spark: SparkResource, lake: LakeResource, kafka: KafkaResource,
                         coordinator: CoordinatorResource) -> MaterializeResult:
    """Retention stream: each partition is one planned slice of TTL / GDPR requests, applied exactly once
    (old rows of an org, or every row of an erased subject, deleted) with one gdpr_audit row per request."""
    plan = coordinator.checkpoints.plan(retention.STREAM, int(context.partition_key))
    with coordinated_batch(context, coordinator, retention.STREAM):  # lock + predecessor, fenced commits, unlock
        result = retention.apply_retention_batch(spark.spark_session, lake.lake, coordinator.checkpoints, kafka.servers, plan)
    report_table_commits(context, retention.STREAM, plan.batch_id, result.versions)
    return MaterializeResult(metadata=result.metadata(), check_results=evaluate_retention_checks(lake.lake, coordinator.checkpoints, result))


def _table_spec(spec, writers: list[AssetKey], description: str) -> AssetSpec:
    return AssetSpec(
        key=spec.name,
        deps=writers,
        group_name=GROUP,
        description=description,
        kinds={"deltalake"},
        metadata={"partitioned_by": ", ".join(spec.partition_by) or "-", "change_data_feed": spec.change_data_feed},
    )


engagement_tables = [
    _table_spec(ENGAGEMENT_ACTIVITY, [INGESTION_ASSET, MUTATION_ASSET, RETENTION_ASSET], "One row per engagement activity, partitioned by org, clustered by engagement date."),
    _table_spec(ENGAGEMENT_NOTIFICATIONS, [INGESTION_ASSET, MUTATION_ASSET, RETENTION_ASSET], "Per org and batch: rows inserted/updated/deleted in a table, for incremental readers."),
    _table_spec(QUARANTINE_ENGAGEMENT_INGESTION, [INGESTION_ASSET, RETENTION_ASSET], "Records that could not be ingested, with raw bytes, source offset and reason."),
    _table_spec(CHECKPOINTS, [INGESTION_ASSET, MUTATION_ASSET, RETENTION_ASSET], "Batch plans (offset ranges) and per-process state of every stream."),
    _table_spec(ENGAGEMENT_MUTATION_REQUESTS, [MUTATION_ASSET, RETENTION_ASSET], "Every valid ID mutation request, as received, partitioned by org and request date."),
    _table_spec(ENGAGEMENT_MUTATIONS_PENDING, [MUTATION_ASSET, RETENTION_ASSET], "Requests whose targets are not in engagement_activity yet, retried until their horizon."),
    _table_spec(QUARANTINE_ENGAGEMENT_MUTATIONS, [MUTATION_ASSET, RETENTION_ASSET], "Malformed requests and requests whose target never arrived, with reason."),
    _table_spec(GDPR_AUDIT, [RETENTION_ASSET], "One row per applied retention or erasure request: received, completed, rows removed per table."),
    _table_spec(QUARANTINE_ENGAGEMENT_GDPR, [RETENTION_ASSET], "Retention / erasure requests that are malformed or repeated, with raw request and reason."),
]
