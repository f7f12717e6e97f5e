"""A stream as a spec: what is its own (its name, its Delta txn app id, the lock it takes, and how one
planned batch is computed and committed). Everything else is shared: the checkpoint store plans and
records the slice, `streams.batch` commits each table once with the txn and the fencing token, the
Dagster factory (`orchestration/`) builds the stream's asset, sensor, job and common checks, and the
`run-batch` command runs one batch by hand (also the crash tests' harness).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from engagement_platform.lake.checkpoints import CheckpointStore
    from engagement_platform.lake.delta import DeltaLake
    from engagement_platform.streams.planning import BatchPlan


@dataclass(frozen=True)
class BatchContext:
    """What a batch runs against: the Spark session (a Connect client), the lake, its checkpoint store,
    the Kafka bootstrap servers and, when the run is coordinated, the coordinator (for a batch that takes
    locks of its own besides its stream's, e.g. one per tenant it writes)."""

    spark: Any
    lake: DeltaLake
    checkpoints: CheckpointStore
    kafka_servers: str
    coordinator: Any = None  # streams.coordinator.Coordinator, or None: no locks


class BatchResult(Protocol):
    """What every stream's batch returns: its plan, the table versions it committed (None: the batch was
    already there) and the figures Dagster shows as metadata."""

    plan: BatchPlan
    versions: dict[str, int | None]

    def metadata(self) -> dict: ...


@dataclass(frozen=True)
class StreamSpec:
    name: str  # checkpoint stream, coordinator job name, runs' stream tag
    app_id: str  # Delta txn app id of the stream's commits
    run_batch: Callable[[BatchContext, BatchPlan], BatchResult]
    lock_name: str | None = None  # coordinator lock it takes; None: none (an append-only stream)


def batch_metadata(
    plan: BatchPlan, versions: Mapping[str, int | None], seconds: Mapping[str, float], **figures: Any
) -> dict:
    """The metadata a Kafka-fed batch reports: its id and offset ranges, the stream's own `figures` (in
    the order given), each table's committed version (None: already there) and each phase's seconds."""
    return {
        "batch_id": plan.batch_id,
        "offset_ranges": plan.ranges_json(),
        **figures,
        **{f"{table}_version": v for table, v in versions.items()},
        **{f"seconds_{phase}": round(v, 3) for phase, v in seconds.items()},
    }
