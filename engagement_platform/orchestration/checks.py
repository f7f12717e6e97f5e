"""The checks a stream's batch shares with other streams, each emitting the numbers it measured so the UI
plots them: offset ranges contiguous, records (or requests) conserved, notifications match changes.

A stream's run evaluates its checks after every table of the batch is committed: they are audits of a
committed batch, so none is declared blocking (blocking would need write, audit, then publish).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.notifications import audit_notifications
from engagement_platform.streams.planning import offset_gaps_and_overlaps
from engagement_platform.streams.spec import BatchResult

OFFSET_RANGES_CONTIGUOUS = "offset_ranges_contiguous"
NOTIFICATIONS_MATCH_CHANGES = "notifications_match_changes"
RECORDS_CONSERVED = "records_conserved"
REQUESTS_ACCOUNTED = "requests_accounted"

Evaluate = Callable[[DeltaLake, CheckpointStore, BatchResult], list[AssetCheckResult]]


@dataclass(frozen=True)
class BatchChecks:
    """Checks of a batch evaluated together (one read of the tables may serve several): name ->
    description the UI shows, and the evaluation returning one result per name."""

    descriptions: Mapping[str, str]
    evaluate: Evaluate

    def specs(self, asset: AssetKey) -> list[AssetCheckSpec]:
        return [AssetCheckSpec(name, asset=asset, description=text) for name, text in self.descriptions.items()]


def check_specs(checks: Sequence[BatchChecks], asset: AssetKey) -> list[AssetCheckSpec]:
    return [spec for c in checks for spec in c.specs(asset)]


def evaluate_checks(
    checks: Sequence[BatchChecks], lake: DeltaLake, checkpoints: CheckpointStore, result: BatchResult
) -> list[AssetCheckResult]:
    return [r for c in checks for r in c.evaluate(lake, checkpoints, result)]


def offset_ranges_contiguous() -> BatchChecks:
    """Every offset between the first and the last planned was planned exactly once, per partition."""

    def evaluate(lake: DeltaLake, checkpoints: CheckpointStore, result: BatchResult) -> list[AssetCheckResult]:
        gaps, overlaps = offset_gaps_and_overlaps(checkpoints.plans(result.plan.stream))
        return [
            AssetCheckResult(
                check_name=OFFSET_RANGES_CONTIGUOUS,
                passed=gaps == 0 and overlaps == 0,
                metadata={"gap_offsets": gaps, "overlap_offsets": overlaps},
            )
        ]

    return BatchChecks(
        {OFFSET_RANGES_CONTIGUOUS: "Planned offset ranges of the stream have no gap and no overlap per partition."},
        evaluate,
    )


def notifications_match_changes(
    notifications: str, table: str, app_id: str, commit: str = "data commit"
) -> BatchChecks:
    """The batch's rows in the notification table `notifications` equal the row-level changes of its commit
    of `table` (its change log or change data feed, lake/change_log.py; `commit` names that commit in the
    description: "data commit", "delete commit", ...)."""

    def evaluate(lake: DeltaLake, checkpoints: CheckpointStore, result: BatchResult) -> list[AssetCheckResult]:
        batch_id = result.plan.batch_id
        version = result.versions.get(table)
        if version is None and lake.exists(
            table
        ):  # committed by an earlier attempt of this batch, or nothing to change
            version = lake.find_batch_commit(table, app_id, batch_id)
        audit = audit_notifications(lake, notifications, table, version, app_id, batch_id)
        return [
            AssetCheckResult(
                check_name=NOTIFICATIONS_MATCH_CHANGES,
                passed=audit.orgs_mismatched == 0,
                metadata={
                    "orgs_mismatched": audit.orgs_mismatched,
                    "orgs_changed": audit.orgs_changed,
                    "rows_changed": audit.rows_changed,
                    "rows_notified": audit.rows_notified,
                    "data_version": version,
                },
            )
        ]

    return BatchChecks(
        {
            NOTIFICATIONS_MATCH_CHANGES: f"The batch's notification rows equal the {commit}'s row-level changes, per org."
        },
        evaluate,
    )


def conservation(
    check_name: str,
    read: tuple[str, int],
    parts: Mapping[str, int],
    planned: int | None = None,
    *,
    extra: Mapping[str, int] | None = None,
    unread_warns: bool = True,
) -> AssetCheckResult:
    """read = sum(parts): every record (or request) read ended up somewhere (a table, the quarantine, the
    pending table). `read` is (metadata key, count); `parts` and `extra` are metadata too.

    With `planned` (the slice's record count), every planned record must also have been read. A record
    unaccounted for is an ERROR; with `unread_warns`, planned but unread offsets only warn (compacted or
    transactional topics legitimately skip offsets)."""
    key, n = read
    unaccounted = n - sum(parts.values())
    metadata = {key: n, **parts, **(extra or {}), "unaccounted": unaccounted}
    passed, severity = unaccounted == 0, AssetCheckSeverity.ERROR
    if planned is not None:
        metadata["planned_but_unread"] = planned - n
        passed = passed and planned == n
        if unread_warns and not unaccounted:
            severity = AssetCheckSeverity.WARN
    return AssetCheckResult(check_name=check_name, passed=passed, severity=severity, metadata=metadata)
