"""Segment evaluation as the platform knows it (registry.py): a stream per tenant, `profile_segments/<tenant>`,
evaluating the tenant's segments (EP_SEGMENTS_DIR) over its raw table. run-batch plans the tenant's next
evaluation, or resumes the unfinished one `--batch-id` names."""

from engagement_platform.profiles.segments.apply import evaluate_tenant, plan_evaluation, segments_stream
from engagement_platform.profiles.segments.definitions import load_segments
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS
from engagement_platform.settings import load_settings
from engagement_platform.streams.by_hand import BatchRequest, BatchRun, check_resumed, member_stream
from engagement_platform.streams.definition import StreamDefinition
from engagement_platform.streams.spec import BatchContext, BatchResult


def dagster_parts():
    # Dagster: loaded with the Definitions
    from engagement_platform.profiles.segments.assets import SEGMENTS
    from engagement_platform.profiles.segments.upkeep.assets import with_compaction

    return with_compaction(SEGMENTS)


def tenant_batch(request: BatchRequest) -> BatchRun:
    tenant = request.member
    check_resumed(request.checkpoints, member_stream(segments_stream, tenant), request.batch_id)

    def evaluate(ctx: BatchContext) -> BatchResult | None:
        plan = plan_evaluation(ctx.lake, ctx.checkpoints, tenant)
        if plan is None:
            return None
        segments = load_segments(load_settings().profiles.segments_dir, tenant)
        return evaluate_tenant(ctx.spark, ctx.lake, ctx.checkpoints, tenant, plan, segments)

    return evaluate


DEFINITION = StreamDefinition(
    name="profile_segments/<tenant>",
    parts=dagster_parts,
    run_batch=tenant_batch,
    settings_section="profiles",
    tables=(PROFILE_SEGMENTS, PROFILE_SEGMENT_CHANGES),
    asset="profile_segments",
)
