"""Asset checks of the ingestion stream. Each emits the number it measured, so the UI plots it."""

from __future__ import annotations

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey

from engagement_platform.engagement import integrity
from engagement_platform.engagement.ingestion.apply import APP_ID, STREAM, IngestResult
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.streams.planning import offset_gaps_and_overlaps

NO_DUPLICATE_ENGAGEMENT_IDS = "no_duplicate_engagement_ids"
NOTIFICATIONS_MATCH_CHANGES = "notifications_match_changes"
OFFSET_RANGES_CONTIGUOUS = "offset_ranges_contiguous"
RECORDS_CONSERVED = "records_conserved"
REQUESTS_ACCOUNTED = "requests_accounted"


def ingestion_check_specs(asset: AssetKey) -> list[AssetCheckSpec]:
    return [
        AssetCheckSpec(NO_DUPLICATE_ENGAGEMENT_IDS, asset=asset, blocking=True,
                       description="No (org_id, engagement_id) appears twice in engagement_activity, in the orgs this batch touched."),
        AssetCheckSpec(NOTIFICATIONS_MATCH_CHANGES, asset=asset, blocking=True,
                       description="The batch's notification rows equal the data commit's change data feed, per org."),
        AssetCheckSpec(OFFSET_RANGES_CONTIGUOUS, asset=asset, blocking=True,
                       description="Planned offset ranges of the stream have no gap and no overlap per partition."),
        AssetCheckSpec(RECORDS_CONSERVED, asset=asset, blocking=True,
                       description="Records read = rows appended + records quarantined, and every planned offset was read."),
    ]


def mutation_check_specs(asset: AssetKey) -> list[AssetCheckSpec]:
    return [
        AssetCheckSpec(NO_DUPLICATE_ENGAGEMENT_IDS, asset=asset, blocking=True,
                       description="No (org_id, engagement_id) appears twice in engagement_activity, in the orgs this batch touched."),
        AssetCheckSpec(NOTIFICATIONS_MATCH_CHANGES, asset=asset, blocking=True,
                       description="The batch's notification rows equal the MERGE commit's change data feed, per org."),
        AssetCheckSpec(OFFSET_RANGES_CONTIGUOUS, asset=asset, blocking=True,
                       description="Planned offset ranges of the stream have no gap and no overlap per partition."),
        AssetCheckSpec(REQUESTS_ACCOUNTED, asset=asset, blocking=True,
                       description="Requests in = applied + still pending + quarantined (malformed or expired); none dropped."),
    ]


def evaluate_mutation_checks(lake: DeltaLake, checkpoints: CheckpointStore, result) -> list[AssetCheckResult]:
    from engagement_platform.engagement.mutation import apply as mutations

    plan = result.plan
    duplicates, _ = integrity.key_audit(lake, result.org_ids, None) if result.org_ids else (0, 0)
    version = result.versions.get(ENGAGEMENT_ACTIVITY.name)
    if version is None:
        version = lake.find_batch_commit(ENGAGEMENT_ACTIVITY.name, mutations.APP_ID, plan.batch_id)
    if version is not None:
        audit = integrity.audit_notifications(lake, ENGAGEMENT_ACTIVITY.name, version, mutations.APP_ID, plan.batch_id)
        mismatched, notify_meta = audit.orgs_mismatched, {"orgs_changed": audit.orgs_changed, "rows_changed": audit.rows_changed, "rows_notified": audit.rows_notified}
    else:  # nothing to change in this batch: no MERGE commit, nothing to notify
        mismatched, notify_meta = 0, {"orgs_changed": 0}
    gaps, overlaps = offset_gaps_and_overlaps(checkpoints.plans(mutations.STREAM))
    pending_now = result.pending_added + result.pending_retained
    unaccounted = result.requests_read - result.requests_malformed - result.requests_valid
    return [
        AssetCheckResult(check_name=NO_DUPLICATE_ENGAGEMENT_IDS, passed=duplicates == 0, metadata={"duplicate_rows": duplicates, "orgs_checked": len(result.org_ids)}),
        AssetCheckResult(check_name=NOTIFICATIONS_MATCH_CHANGES, passed=mismatched == 0, metadata={"orgs_mismatched": mismatched, **notify_meta, "data_version": version}),
        AssetCheckResult(check_name=OFFSET_RANGES_CONTIGUOUS, passed=gaps == 0 and overlaps == 0, metadata={"gap_offsets": gaps, "overlap_offsets": overlaps}),
        AssetCheckResult(
            check_name=REQUESTS_ACCOUNTED, passed=unaccounted == 0,
            metadata={"requests_read": result.requests_read, "requests_valid": result.requests_valid, "requests_malformed": result.requests_malformed,
                      "requests_applied": result.requests_applied, "pending_now": pending_now, "pending_expired": result.pending_expired,
                      "unaccounted": unaccounted},
        ),
    ]


def evaluate_ingestion_checks(lake: DeltaLake, checkpoints: CheckpointStore, result: IngestResult, org_ids: list[str]) -> list[AssetCheckResult]:
    plan = result.plan
    duplicates, appended = integrity.key_audit(lake, org_ids, plan.batch_id) if org_ids else (0, 0)

    data_version = result.versions.get(ENGAGEMENT_ACTIVITY.name)
    if data_version is None:  # committed by an earlier attempt of this batch
        data_version = lake.find_batch_commit(ENGAGEMENT_ACTIVITY.name, APP_ID, plan.batch_id)
    audit = integrity.audit_notifications(lake, ENGAGEMENT_ACTIVITY.name, data_version, APP_ID, plan.batch_id)

    gaps, overlaps = offset_gaps_and_overlaps(checkpoints.plans(STREAM))

    quarantined = integrity.quarantined_records(lake, STREAM, plan.batch_id)
    unaccounted = result.records_read - appended - quarantined
    unread = plan.record_count - result.records_read
    return [
        AssetCheckResult(check_name=NO_DUPLICATE_ENGAGEMENT_IDS, passed=duplicates == 0, metadata={"duplicate_rows": duplicates, "orgs_checked": len(org_ids)}),
        AssetCheckResult(
            check_name=NOTIFICATIONS_MATCH_CHANGES,
            passed=audit.orgs_mismatched == 0,
            metadata={"orgs_mismatched": audit.orgs_mismatched, "orgs_changed": audit.orgs_changed,
                      "rows_changed": audit.rows_changed, "rows_notified": audit.rows_notified, "data_version": data_version},
        ),
        AssetCheckResult(check_name=OFFSET_RANGES_CONTIGUOUS, passed=gaps == 0 and overlaps == 0, metadata={"gap_offsets": gaps, "overlap_offsets": overlaps}),
        AssetCheckResult(
            check_name=RECORDS_CONSERVED,
            passed=unaccounted == 0 and unread == 0,
            # Offsets can legitimately be missing on compacted or transactional topics: warn, don't block.
            severity=AssetCheckSeverity.ERROR if unaccounted else AssetCheckSeverity.WARN,
            metadata={"records_read": result.records_read, "rows_in_table": appended, "records_quarantined": quarantined,
                      "unaccounted": unaccounted, "planned_but_unread": unread},
        ),
    ]


SUBJECT_ERASED_EVERYWHERE = "subject_erased_everywhere"


def retention_check_specs(asset: AssetKey) -> list[AssetCheckSpec]:
    return [
        AssetCheckSpec(SUBJECT_ERASED_EVERYWHERE, asset=asset, blocking=True,
                       description="No row of a subject this batch erased remains in any table (rows that arrived before the erasure)."),
        AssetCheckSpec(NOTIFICATIONS_MATCH_CHANGES, asset=asset, blocking=True,
                       description="The batch's notification rows equal the delete commit's change data feed, per org."),
        AssetCheckSpec(OFFSET_RANGES_CONTIGUOUS, asset=asset, blocking=True,
                       description="Planned offset ranges of the stream have no gap and no overlap per partition."),
        AssetCheckSpec(REQUESTS_ACCOUNTED, asset=asset, blocking=True,
                       description="Requests read = applied (gdpr_audit rows) + quarantined (quarantine_engagement_gdpr records); none dropped."),
    ]


def evaluate_retention_checks(lake: DeltaLake, checkpoints: CheckpointStore, result) -> list[AssetCheckResult]:
    """Measured from the committed tables (gdpr_audit, the quarantine, every erased table), not from the run's own counts."""
    import pyarrow.compute as pc

    from engagement_platform.engagement.retention import apply as retention
    from engagement_platform.engagement.retention.erasure import subject_rows_remaining
    from engagement_platform.engagement.retention.tables import GDPR_AUDIT, QUARANTINE_ENGAGEMENT_GDPR

    plan = result.plan
    erasures = retention.audited_erasures(lake, plan.batch_id)
    remaining = subject_rows_remaining(lake, erasures, result.as_of)
    version = result.versions.get(ENGAGEMENT_ACTIVITY.name)
    if version is None and lake.exists(ENGAGEMENT_ACTIVITY.name):
        version = lake.find_batch_commit(ENGAGEMENT_ACTIVITY.name, retention.APP_ID, plan.batch_id)
    if version is not None:
        audit = integrity.audit_notifications(lake, ENGAGEMENT_ACTIVITY.name, version, retention.APP_ID, plan.batch_id)
        mismatched, notify_meta = audit.orgs_mismatched, {"orgs_changed": audit.orgs_changed, "rows_changed": audit.rows_changed, "rows_notified": audit.rows_notified}
    else:  # nothing deleted from engagement_activity: no commit, nothing to notify
        mismatched, notify_meta = 0, {"orgs_changed": 0}
    gaps, overlaps = offset_gaps_and_overlaps(checkpoints.plans(retention.STREAM))
    applied = lake.read(GDPR_AUDIT.name, filters=[("batch_id", "=", plan.batch_id)], columns=["request_id"]).num_rows if lake.exists(GDPR_AUDIT.name) else 0
    quarantined = lake.read(QUARANTINE_ENGAGEMENT_GDPR.name, filters=[("batch_id", "=", plan.batch_id)], columns=["row_id"])
    quarantined = pc.count_distinct(quarantined["row_id"]).as_py() if quarantined.num_rows else 0
    unaccounted = result.requests_read - applied - quarantined
    return [
        AssetCheckResult(
            check_name=SUBJECT_ERASED_EVERYWHERE, passed=sum(remaining.values()) == 0,
            metadata={"erasures_checked": len(erasures), "rows_remaining": sum(remaining.values()),
                      **{f"rows_remaining_{t}": n for t, n in remaining.items()}},
        ),
        AssetCheckResult(check_name=NOTIFICATIONS_MATCH_CHANGES, passed=mismatched == 0, metadata={"orgs_mismatched": mismatched, **notify_meta, "data_version": version}),
        AssetCheckResult(check_name=OFFSET_RANGES_CONTIGUOUS, passed=gaps == 0 and overlaps == 0, metadata={"gap_offsets": gaps, "overlap_offsets": overlaps}),
        AssetCheckResult(
            check_name=REQUESTS_ACCOUNTED, passed=unaccounted == 0 and result.requests_read == result.plan.record_count,
            metadata={"requests_read": result.requests_read, "requests_applied": applied, "requests_quarantined": quarantined,
                      "unaccounted": unaccounted, "planned_but_unread": result.plan.record_count - result.requests_read},
        ),
    ]
