"""The mutation stream in Dagster: topic engagement.mutations -> engagement_mutation (one partition per
planned slice of requests: Spark tasks reduce each org's requests and rewrite the files they touch, committed
to engagement_activity as one commit of file adds and removes) -> the engagement tables.

Pending requests are retried with every batch, and on their own (an empty slice, retry.py) when
ingestion has finished batches since the last mutation batch and the pending table is not empty, or when
a pending request's age horizon ran out since the last mutation batch (it expires then, even in a quiet system).
"""

from dagster import AssetKey

from engagement_platform.engagement.assets import GROUP, MUTATION_ASSET, REWRITE_POOL
from engagement_platform.engagement.mutation.apply import SPEC
from engagement_platform.engagement.mutation.checks import MUTATION_CHECKS
from engagement_platform.engagement.mutation.retry import expiry_retry, pending_retry
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.orchestration.kafka_stream import IdleRun, KafkaStreamDefinition, build_kafka_stream
from engagement_platform.orchestration.topics import Watermarks
from engagement_platform.settings import load_settings
from engagement_platform.streams.planning import BatchPlan

TOPIC_ASSET = AssetKey(["kafka", "engagement_mutations"])
RETRY_TAG = "engagement/pending_retry_after_ingestion_batch"  # on mutation runs planned only to retry pending requests
EXPIRY_TAG = "engagement/pending_horizon_ran_out_at"  # on mutation runs planned only to expire pending requests


def pending_retry_run(store: CheckpointStore, latest: BatchPlan | None, watermarks: Watermarks) -> IdleRun | None:
    """The idle tick's run: the pending retry, its run key naming the ingestion batch that made it due, or
    the moment a pending request's age horizon ran out."""
    retry = pending_retry(store, latest, watermarks)
    if retry is not None:
        plan, ingested = retry
        return IdleRun(plan, {RETRY_TAG: str(ingested)}, f"/retry-after-ingestion-{ingested}")
    expiry = expiry_retry(store, latest, watermarks)
    if expiry is not None:
        plan, due = expiry
        return IdleRun(plan, {EXPIRY_TAG: due.isoformat()}, f"/expire-pending-due-{due.isoformat()}")
    return None


MUTATION = build_kafka_stream(
    KafkaStreamDefinition(
        spec=SPEC,
        asset_key=MUTATION_ASSET,
        topic_asset_key=TOPIC_ASSET,
        topic=lambda: load_settings().mutation.topic,
        description="Mutation stream: each partition is one planned slice of requests, reduced (cascades) and applied "
        "exactly once by Spark tasks that rewrite the files they touch (one commit of engagement_activity); requests "
        "whose targets are not ingested yet wait in pending.",
        topic_description="Kafka topic of ID mutation requests: convert, merge, delete, update (EP_MUTATIONS_TOPIC).",
        group=GROUP,
        pool=REWRITE_POOL,
        checks=MUTATION_CHECKS,
        job_description="Apply one planned slice of ID mutation requests to the engagement lake "
        "(rewritten files, one commit).",
        sensor_description="Plans the next slice of engagement.mutations when the previous mutation batch is done; retries "
        "pending requests on their own once ingestion has finished batches since the last mutation batch, "
        "or once a pending request's age horizon ran out.",
        idle_plan=pending_retry_run,
    )
)
engagement_mutations_topic = MUTATION.topic_asset
engagement_mutation = MUTATION.asset
mutation_batches = MUTATION.partitions
mutation_job = MUTATION.job
engagement_mutation_sensor = MUTATION.sensor
