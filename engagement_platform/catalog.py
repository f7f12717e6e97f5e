"""Every stream by name, and how one of its batches runs by hand: the `run-batch` command, which is also
the crash tests' harness.

A Kafka-fed stream is its apply module's spec, run on the plan its sensor stored in the checkpoint
store. The profile processor, backfill and segment evaluation plan per tenant themselves (`--batch-id` then names the
unfinished batch the run resumes). A landing pipeline runs one planned file. Runs by hand take no
coordinator lock. Like definitions.py, this module may import every domain; no domain imports it.
"""

from __future__ import annotations

from collections.abc import Callable

from engagement_platform.engagement.ingestion.apply import SPEC as INGESTION
from engagement_platform.engagement.mutation.apply import SPEC as MUTATION
from engagement_platform.engagement.retention.apply import SPEC as RETENTION
from engagement_platform.ingest.config import PipelineConfig, load_pipelines
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.landing.apply import run_file_batch
from engagement_platform.landing.apply import stream_name as landing_stream
from engagement_platform.profiles.backfill.apply import backfill_stream, backfill_tenant
from engagement_platform.profiles.erasure.apply import SPEC as PROFILE_ERASURE
from engagement_platform.profiles.processor.apply import process_tenant, processor_stream
from engagement_platform.profiles.segments.apply import evaluate_tenant, plan_evaluation, segments_stream
from engagement_platform.profiles.segments.definitions import load_segments
from engagement_platform.profiles.staging.apply import SPEC as PROFILE_CDC
from engagement_platform.settings import load_settings
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.spec import BatchContext, BatchResult, StreamSpec

SPECS: dict[str, StreamSpec] = {
    spec.name: spec for spec in (INGESTION, MUTATION, RETENTION, PROFILE_CDC, PROFILE_ERASURE)
}
PROCESSOR, BACKFILL, SEGMENTS, LANDING = (
    "profile_processor",
    "profile_backfill",
    "profile_segments",
    "ingest",
)  # <family>/<tenant or pipeline>
STREAM_NAMES = (
    *SPECS,
    f"{PROCESSOR}/<tenant>",
    f"{BACKFILL}/<tenant>",
    f"{SEGMENTS}/<tenant>",
    f"{LANDING}/<pipeline>",
)

BatchRun = Callable[[BatchContext], BatchResult | None]  # None: the processor found nothing staged


class BatchRequestError(ValueError):
    """Arguments that name no batch run-batch can run (unknown stream, no such plan, a missing option)."""


def batch_run(
    stream: str,
    checkpoints: CheckpointStore,
    batch_id: int | None = None,
    path: str | None = None,
    until: str | None = None,
) -> BatchRun:
    """How to run one batch of `stream` by hand, resolved and checked before anything runs."""
    if stream in SPECS:
        spec = SPECS[stream]
        plan = stored_plan(checkpoints, spec.name, batch_id)
        return lambda ctx: spec.run_batch(ctx, plan)
    family, _, key = stream.partition("/")
    if family == PROCESSOR and key:
        check_resumed(checkpoints, tenant_stream(processor_stream, key), batch_id)
        return lambda ctx: process_tenant(ctx.spark, ctx.lake, ctx.checkpoints, key)
    if family == SEGMENTS and key:
        check_resumed(checkpoints, tenant_stream(segments_stream, key), batch_id)

        def evaluate(ctx: BatchContext):
            plan = plan_evaluation(ctx.lake, ctx.checkpoints, key)
            return (
                None
                if plan is None
                else evaluate_tenant(
                    ctx.spark,
                    ctx.lake,
                    ctx.checkpoints,
                    key,
                    plan,
                    load_segments(load_settings().profiles.segments_dir, key),
                )
            )

        return evaluate
    if family == BACKFILL and key:
        if not (path and until):
            raise BatchRequestError(f"{stream} needs --path and --until (the snapshot export and its time boundary)")
        check_resumed(checkpoints, tenant_stream(backfill_stream, key), batch_id)
        return lambda ctx: backfill_tenant(ctx.spark, ctx.lake, ctx.checkpoints, key, path, until)
    config = landing_pipeline(stream)
    if config is not None:
        plan = stored_plan(checkpoints, landing_stream(config), batch_id)
        return lambda ctx: run_file_batch(ctx.spark, ctx.lake, ctx.checkpoints, config, plan)
    raise BatchRequestError(f"unknown stream {stream!r}: one of {', '.join(STREAM_NAMES)}")


def stored_plan(checkpoints: CheckpointStore, stream: str, batch_id: int | None) -> BatchPlan:
    if batch_id is None:
        raise BatchRequestError(f"{stream} needs --batch-id (a batch its sensor planned)")
    try:
        return checkpoints.plan(stream, batch_id)
    except LookupError as exc:
        raise BatchRequestError(str(exc)) from exc


def tenant_stream(name_of: Callable[[str], str], tenant: str) -> str:
    try:
        return name_of(tenant)
    except ValueError as exc:  # not a valid tenant name
        raise BatchRequestError(str(exc)) from exc


def check_resumed(checkpoints: CheckpointStore, stream: str, batch_id: int | None) -> None:
    """A self-planning stream's run resumes its unfinished batch, else plans the next one: a given
    batch id must be that unfinished batch."""
    if batch_id is None:
        return
    latest, done = checkpoints.latest(stream)
    if latest is not None and not done and latest.batch_id == batch_id:
        return
    state = (
        "nothing planned yet" if latest is None else f"batch {latest.batch_id} is {'done' if done else 'unfinished'}"
    )
    raise BatchRequestError(
        f"{stream} batch {batch_id} is not an unfinished batch ({state}); run without --batch-id to plan the next one"
    )


def landing_pipeline(stream: str) -> PipelineConfig | None:
    """The landing pipeline `ingest/<pipeline>` (or its checkpoint stream name) names, from EP_PIPELINES_DIR."""
    if not stream.startswith(LANDING):
        return None
    for config in load_pipelines(load_settings().pipelines_dir):
        if stream in (f"{LANDING}/{config.name}", landing_stream(config)):
            return config
    return None
