"""A stream run rides out faults that clear by themselves: an attempt at its batch that meets a lost lease,
ZooKeeper away, or the broker or Spark server away is tried again from the batch's plan in the same run, for
a bounded time, instead of failing the run and waiting for the sensor's retry (a relaunch and a place in the
run queue: minutes on a busy machine, and a red run in the UI for a fault that cleared).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from dagster import AssetExecutionContext, DagsterRunStatus

from engagement_platform.orchestration.runs import (
    LOCK_WAIT_METADATA,
    coordinated_batch,
    coordination_failures,
    unavailable_service,
)
from engagement_platform.resources import CoordinatorResource, SparkResource
from engagement_platform.streams.coordinator import CoordinationGaveUp, Lease, LeaseLost, LockBusy, PredecessorRefused

T = TypeVar("T")

RIDE_OUT_S = 120.0  # how long a run without a coordinator tries its batch again after passing faults
RIDE_OUT_PAUSES_S = (5.0, 10.0, 20.0)  # between a run's attempts at its batch; the last one repeats


def passing_fault(error: BaseException) -> str | None:
    """What fault, one that clears by itself, ended an attempt at a batch: the lease lost (a ZooKeeper
    session expired, the run paused past it), ZooKeeper away, or the broker or Spark server unreachable;
    None for anything else. Waiting one's turn (the lock busy past the run's patience, the predecessor
    rule) is not such a fault: the sensor holds the batch until its turn comes."""
    if isinstance(error, (LockBusy, PredecessorRefused)):
        return None
    if isinstance(error, LeaseLost):
        return "lease lost"
    if isinstance(error, CoordinationGaveUp):  # ZooKeeper away, or a session replaced while taking the lock
        return "coordination gave up"
    service = unavailable_service(error)
    return f"{service} unavailable" if service else None


def run_riding_out_faults(
    context: AssetExecutionContext,
    stream: str,
    attempt: Callable[[], T],
    coordinator: CoordinatorResource | None = None,
    lock_name: str | None = None,
    on_fault: Callable[[str], None] | None = None,
) -> T:
    """The run's batch (its partition): `attempt()` (compute and commit from the batch's plan) inside the
    coordinator's lock when there is one (coordinated_batch), riding out passing faults (ride_out) for
    `ride_out_faults_s` (RIDE_OUT_S without a coordinator). Exactly-once holds as for a retry run: every
    attempt starts from the same plan and every commit carries the batch's txn, so what an earlier attempt
    committed is skipped."""
    batch_id = int(context.partition_key)
    hold = (lambda: coordinated_batch(context, coordinator, stream, lock_name)) if coordinator is not None else None
    return ride_out(
        context,
        f"{stream} batch {batch_id}" + (": coordinator" if coordinator is not None else ""),
        attempt,
        hold,
        coordinator.ride_out_faults_s if coordinator is not None else RIDE_OUT_S,
        on_fault,
        then="; a later tick retries the batch from its plan",
        batch_id=batch_id,
    )


def ride_out(
    context: AssetExecutionContext,
    what: str,
    attempt: Callable[[], T],
    hold: Callable[[], AbstractContextManager[Lease | None]] | None = None,
    patience_s: float = RIDE_OUT_S,
    on_fault: Callable[[str], None] | None = None,
    then: str = "",
    **failure_metadata: Any,
) -> T:
    """`attempt()` inside `hold()` (a lock: the lease fences its commits; None: no lock), tried again in the
    same run after a passing fault (passing_fault) while less than `patience_s` has passed since the first
    one, RIDE_OUT_PAUSES_S apart; `on_fault(fault)` runs before each new attempt (e.g. a new Spark session
    after a server restart). A run that fails and is retried by the sensor pays a relaunch and a place in
    the run queue, both long on a busy machine (queue waits of 3 minutes under faults), and shows red for a
    fault the platform rode out. Every attempt must start from its plan (what an earlier attempt committed
    is found by its txn and skipped). When the faults outlast the bound, or anything else fails, the run
    fails as before (coordination_failures, saying `what` and `then`, with `failure_metadata`); the
    materialization's `attempts_in_run` says how many attempts it took, LOCK_WAIT_METADATA their lock waits."""
    first_fault, attempts, waited_s = None, 1, None  # waited_s: None while no attempt held a lease
    with coordination_failures(context, what, then, **failure_metadata):
        while True:
            try:
                if hold is None:
                    result = attempt()
                else:
                    with hold() as lease:
                        if lease is not None:
                            waited_s = (waited_s or 0.0) + lease.waited_s
                        result = attempt()
                if waited_s is not None:
                    add_asset_output_metadata(context, {LOCK_WAIT_METADATA: round(waited_s, 3)})
                add_asset_output_metadata(context, {"attempts_in_run": attempts})
                return result
            except Exception as e:  # noqa: BLE001 - re-raised unless a passing fault within the bound
                fault = passing_fault(e)
                first_fault = first_fault if first_fault is not None else time.monotonic()
                if fault is None or time.monotonic() - first_fault >= patience_s:
                    raise
                pause = RIDE_OUT_PAUSES_S[min(attempts - 1, len(RIDE_OUT_PAUSES_S) - 1)]
                context.log.warning(
                    f"{what}: {fault} ({type(e).__name__}: {str(e)[:300]}); attempt {attempts + 1} "
                    f"in this run starts from the plan in {pause:g}s (rides out faults for {patience_s:g}s)"
                )
                time.sleep(pause)
                if not still_running(
                    context
                ):  # asked after the pause: the sensor may have taken the batch over meanwhile
                    raise
                attempts += 1
                if on_fault is not None:
                    on_fault(fault)


def still_running(context: AssetExecutionContext) -> bool:
    """The run is still STARTED: a run paused past its liveness node's session may have been failed as an
    orphan meanwhile (orphans.py), and its batch handed to a retry run; it must not try again itself."""
    try:
        run = context.instance.get_run_by_id(context.run_id)
    except Exception:  # noqa: BLE001 - the run storage did not answer: stop trying, the sensor retries the batch
        return False
    return run is None or run.status == DagsterRunStatus.STARTED


def spark_reconnect(spark: SparkResource) -> Callable[[str], None]:
    """run_riding_out_faults' on_fault for a run on `spark`: a new session after the Spark server was away."""

    def on_fault(fault: str) -> None:
        if fault == "spark unavailable":
            spark.reconnect()

    return on_fault


def add_asset_output_metadata(context: AssetExecutionContext, metadata: dict) -> None:
    """Metadata on the asset's output (its check results are outputs too, so the name is needed)."""
    context.add_output_metadata(
        metadata, output_name=context.assets_def.get_output_name_for_asset_key(context.asset_key)
    )
