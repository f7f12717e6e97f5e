"""The profile processor as the platform knows it (registry.py): a stream per tenant, `profile_processor/<tenant>`,
merging the tenant's staged changes into its raw table (profile_raw's partition). run-batch plans the tenant's
next batch, or resumes the unfinished one `--batch-id` names."""

from engagement_platform.profiles.processor.apply import process_tenant, processor_stream
from engagement_platform.profiles.tables import PROFILE_PROGRESS
from engagement_platform.streams.by_hand import BatchRequest, BatchRun, check_resumed, member_stream
from engagement_platform.streams.definition import StreamDefinition


def dagster_parts():
    from engagement_platform.profiles.processor.sensors import PROCESSOR  # Dagster: loaded with the Definitions

    return PROCESSOR


def tenant_batch(request: BatchRequest) -> BatchRun:
    tenant = request.member
    check_resumed(request.checkpoints, member_stream(processor_stream, tenant), request.batch_id)
    return lambda ctx: process_tenant(ctx.spark, ctx.lake, ctx.checkpoints, tenant)


DEFINITION = StreamDefinition(
    name="profile_processor/<tenant>",
    parts=dagster_parts,
    run_batch=tenant_batch,
    settings_section="profiles",
    tables=(PROFILE_PROGRESS,),
    asset="profile_raw",
)
