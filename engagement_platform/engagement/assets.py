"""Assets of the engagement activity lake.

Several streams write the same Delta tables, and an asset key has one producer in Dagster. So each
stream is its own partitioned asset (one partition per committed batch), and the tables are
downstream assets whose materializations the stream runs report (table version, rows). The lineage
graph reads: Kafka topic -> stream -> tables, and gains a stream node per stream.
"""


from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetSpec,
    DataVersion,
    MaterializeResult,
    ObserveResult,
    asset,
    observable_source_asset,
)

from engagement_platform.engagement.checks import evaluate_ingestion_checks, ingestion_check_specs
from engagement_platform.engagement.ingestion import STREAM, ingest_batch
from engagement_platform.engagement.partitions import ingestion_batches
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY, ENGAGEMENT_NOTIFICATIONS, QUARANTINE_ENGAGEMENT_INGESTION
from engagement_platform.lake.checkpoints import CHECKPOINTS
from engagement_platform.resources import KafkaResource, LakeResource, SparkResource
from engagement_platform.settings import load_settings

GROUP = "engagement"
INGESTION_ASSET = AssetKey("engagement_ingestion")
TOPIC_ASSET = AssetKey(["kafka", "engagement_activities"])


def watermark_metadata(watermarks: dict[int, tuple[int, int]]) -> dict:
    return {
        "messages_total": sum(h for _, h in watermarks.values()),
        **{f"partition_{p}_high": h for p, (_, h) in sorted(watermarks.items())},
        **{f"partition_{p}_low": lo for p, (lo, _) in sorted(watermarks.items())},
    }


def topic_observation(watermarks: dict[int, tuple[int, int]]) -> AssetObservation:
    """What the ingestion sensor reports on every tick that reads the watermarks."""
    return AssetObservation(asset_key=TOPIC_ASSET, metadata=watermark_metadata(watermarks))


@observable_source_asset(key=TOPIC_ASSET, group_name=GROUP, description="Kafka topic of engagement activities from the sales apps (EP_ACTIVITIES_TOPIC).")
def engagement_activities_topic(kafka: KafkaResource) -> ObserveResult:
    marks = kafka.client.watermarks(load_settings().activities_topic)
    return ObserveResult(data_version=DataVersion(str(sum(h for _, h in marks.values()))), metadata=watermark_metadata(marks))


@asset(
    key=INGESTION_ASSET,
    deps=[TOPIC_ASSET],
    partitions_def=ingestion_batches,
    check_specs=ingestion_check_specs(INGESTION_ASSET),
    group_name=GROUP,
    kinds={"spark", "deltalake", "kafka"},
)
def engagement_ingestion(context: AssetExecutionContext, spark: SparkResource, lake: LakeResource, kafka: KafkaResource) -> MaterializeResult:
    """Ingestion stream: each partition is one planned Kafka offset slice, appended exactly once."""
    plan = lake.checkpoints.plan(STREAM, int(context.partition_key))
    result = ingest_batch(spark.spark_session, lake.lake, lake.checkpoints, kafka.servers, plan)
    for table, version in result.versions.items():
        context.log_event(
            AssetMaterialization(
                asset_key=table,
                description=f"{STREAM} batch {plan.batch_id}",
                metadata={"batch_id": plan.batch_id, "table_version": version if version is not None else "already committed", "stream": STREAM},
            )
        )
    return MaterializeResult(
        metadata=result.metadata(),
        check_results=evaluate_ingestion_checks(lake.lake, lake.checkpoints, result, result.org_ids),
    )


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
    _table_spec(ENGAGEMENT_ACTIVITY, [INGESTION_ASSET], "One row per engagement activity, partitioned by org, clustered by engagement date."),
    _table_spec(ENGAGEMENT_NOTIFICATIONS, [INGESTION_ASSET], "Per org and batch: rows inserted/updated/deleted in a table, for incremental readers."),
    _table_spec(QUARANTINE_ENGAGEMENT_INGESTION, [INGESTION_ASSET], "Records that could not be ingested, with raw bytes, source offset and reason."),
    _table_spec(CHECKPOINTS, [INGESTION_ASSET], "Batch plans (offset ranges) and per-process state of every stream."),
]
