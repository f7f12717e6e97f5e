"""The snapshot backfill as the platform knows it (registry.py): a stream per tenant, `profile_backfill/<tenant>`,
loading a hot-store export into the tenant's raw table (profile_raw's partition). run-batch needs the export
(`--path`) and its time boundary (`--until`), and resumes the unfinished batch `--batch-id` names."""

from engagement_platform.profiles.backfill.apply import backfill_stream, backfill_tenant
from engagement_platform.profiles.tables import PROFILE_SUPPRESSED_RECORDS, QUARANTINE_PROFILE_CDC
from engagement_platform.streams.by_hand import BatchRequest, BatchRequestError, BatchRun, check_resumed, member_stream
from engagement_platform.streams.definition import StreamDefinition


def dagster_parts():
    from engagement_platform.profiles.backfill.assets import BACKFILL  # Dagster: loaded with the Definitions

    return BACKFILL


def tenant_batch(request: BatchRequest) -> BatchRun:
    tenant, path, until = request.member, request.path, request.until
    if not (path and until):
        raise BatchRequestError(
            f"{request.stream} needs --path and --until (the snapshot export and its time boundary)"
        )
    check_resumed(request.checkpoints, member_stream(backfill_stream, tenant), request.batch_id)
    return lambda ctx: backfill_tenant(ctx.spark, ctx.lake, ctx.checkpoints, tenant, path, until)


DEFINITION = StreamDefinition(
    name="profile_backfill/<tenant>",
    parts=dagster_parts,
    run_batch=tenant_batch,
    tables=(QUARANTINE_PROFILE_CDC, PROFILE_SUPPRESSED_RECORDS),
    asset="profile_backfill",
)
