"""The Dagster side every stream shares: what its sensor does with a batch that is planned but not
done yet, and how its run reports the tables it committed.

Batches of a stream commit strictly in order (their ids are the Delta txn versions), so a sensor
plans the next batch only once the latest is done. Until then it waits for the run in flight, or
requests the same plan again after a failure, up to MAX_ATTEMPTS; then the stream pauses with a
SkipReason until someone re-executes that partition.

Waiting one's turn is normal operation, not a failure. The sensor launches no run while the stream's
lock is held (`TurnWait`: it skips the tick saying who holds it), nor a retry of a batch that gave
up while the predecessor rule would refuse it again. A run that finds the lock held anyway keeps
waiting (`coordinated_batch`: rounds of the lock timeout, each logged, up to the resource's
`max_lock_wait_s`); the time it waited is the materialization's `seconds_waiting_for_lock`.

A fault that clears by itself (a lost lease, ZooKeeper, the broker or Spark away) is first ridden out in
the run: it tries its batch again from the plan for up to `ride_out_faults_s` (ride_out.py).
When the coordinator gives up all the same (the lock still held after that bound, predecessor
mismatch, ZooKeeper unreachable) or the lease is lost before a commit, the run fails without
committing anything more and is tagged COORDINATION_TAG; such runs do not count towards
MAX_ATTEMPTS (the batch is not at fault), so the sensor keeps requesting the same plan on later
ticks. They still number the attempts, so every retry has a new run key.

A run in flight whose process is gone (a crash of the Dagster host: no liveness node in ZooKeeper) is
marked failed by the sensor and retried the same way, without counting as an attempt (orphans.py). Nor do
runs whose process was killed or vanished (Dagster records no failure reason for them), nor runs that met
a broker or Spark server that could not be reached (UNAVAILABLE_TAG): only a batch whose own code failed
MAX_ATTEMPTS times pauses its stream, so a fault that has cleared never leaves one paused. A batch whose
runs keep dying that way (an out-of-memory kill on every attempt, a broker down for an hour) is not retried
in a tight loop either: after FREE_RETRIES such runs the sensor waits a growing pause (retry_backoff_s)
after the last one ended, and says so in its skip reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException
from dagster import (
    AssetExecutionContext,
    AssetMaterialization,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DynamicPartitionsDefinition,
    Failure,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
)
from pyspark.errors.exceptions.connect import SparkConnectException

from engagement_platform.orchestration.orphans import ORPHANED_TAG, reap_orphans, retry_tags
from engagement_platform.resources import CoordinatorResource, holder_owner
from engagement_platform.streams.batch import fenced
from engagement_platform.streams.coordinator import CoordinationGaveUp, Lease, LeaseLost, LockBusy, PredecessorRefused
from engagement_platform.streams.planning import BatchPlan

T = TypeVar("T")

STREAM_TAG = "engagement/stream"  # dagster.yaml limits runs to one per value of this tag
MAX_ATTEMPTS = 3
UNFINISHED = {
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
}
FAILED = {DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
COORDINATION_TAG = "engagement/coordination"  # "gave_up" | "lease_lost" on runs that ended that way
UNAVAILABLE_TAG = "engagement/unavailable"  # "kafka" | "spark" on runs that failed because the service was away
FAILURE_REASON_TAG = "dagster/failure_reason"  # Dagster's: set when the run's code failed, absent when its process died
CODE_FAILURES = {"STEP_FAILURE", "RUN_EXCEPTION", "JOB_INITIALIZATION_FAILURE"}
KAFKA_UNREACHABLE = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError._RESOLVE}
# Transport failures, and the server's SparkContext stopped under a running query (the server shutting down:
# the client reports an UnknownException, which must not count as an attempt of the batch).
# A client whose server restarted between two calls is refused with SESSION_CHANGED: a new client works.
SPARK_UNREACHABLE = (
    "StatusCode.UNAVAILABLE",
    "failed to connect to all addresses",
    "Connection refused",
    "Socket closed",
    "Cannot call methods on a stopped SparkContext",
    "INVALID_HANDLE.SESSION_CHANGED",
)
FREE_RETRIES = 6  # runs of one batch that may die (killed, orphaned, a service away) before retries back off
BACKOFF_S = (30.0, 600.0)  # the first pause after FREE_RETRIES, and the longest: it doubles in between
LOCK_WAIT_METADATA = "seconds_waiting_for_lock"  # on the materialization of every coordinated batch

# Why a run of the batch would wait for its turn right now, or None: (plan, after a coordination give-up).
# Called with False before a new batch's run or any retry (the lock), with True after a give-up (the lock
# and the predecessor rule). A factory sensor builds it from CoordinatorResource.lock_wait/predecessor_wait.
TurnWait = Callable[[BatchPlan, bool], str | None]


def run_request(plan: BatchPlan, attempt: int, tags: dict[str, str]) -> RunRequest:
    return RunRequest(
        # The first attempt's key is the slice itself; a retry appends the attempt number, which is
        # derived from the failed runs recorded for this partition, not from the clock.
        run_key=plan.run_key if attempt == 1 else f"{plan.run_key}#attempt{attempt}",
        partition_key=plan.partition_key,
        tags={STREAM_TAG: plan.stream, "engagement/batch_id": str(plan.batch_id), **tags},
    )


def counts_as_attempt(run: DagsterRun) -> bool:
    """A failed run counts towards MAX_ATTEMPTS only when the batch may be at fault: its code raised (Dagster's
    failure reason says a step, the run or the job's initialisation failed) or a person cancelled it. Not: a
    coordination give-up or lost lease, a service that was unavailable (UNAVAILABLE_TAG), a process that died
    with its host (ORPHANED_TAG), nor a run whose process was killed or vanished (no failure reason): faults
    that clear must never pause a stream (a batch's runs can be killed three times in a row by faults alone)."""
    if COORDINATION_TAG in run.tags or ORPHANED_TAG in run.tags or UNAVAILABLE_TAG in run.tags:
        return False
    return run.status == DagsterRunStatus.CANCELED or run.tags.get(FAILURE_REASON_TAG) in CODE_FAILURES


def died(run: DagsterRun) -> bool:
    """The run ended without its code failing and without a coordination give-up: killed, orphaned, or it met
    an unreachable service. Such runs do not count as attempts, but retries of them back off."""
    return run.status == DagsterRunStatus.FAILURE and COORDINATION_TAG not in run.tags and not counts_as_attempt(run)


def retry_backoff_s(deaths: int) -> float:
    """Seconds to wait after the last run ended before retrying a batch whose runs died `deaths` times: none
    for the first FREE_RETRIES, then BACKOFF_S[0], doubling up to BACKOFF_S[1]."""
    if deaths <= FREE_RETRIES:
        return 0.0
    return min(BACKOFF_S[0] * 2 ** min(deaths - FREE_RETRIES - 1, 30), BACKOFF_S[1])  # no float overflow after years


def backoff_wait(instance: DagsterInstance, ended: list[DagsterRun], what: str) -> str | None:
    """The skip reason while the retry of `what` (runs `ended`, newest first) backs off, else None."""
    deaths = sum(died(r) for r in ended)
    pause = retry_backoff_s(deaths)
    if not pause or not ended:
        return None
    record = instance.get_run_record_by_id(ended[0].run_id)
    last_end = (record.end_time or record.update_timestamp.timestamp()) if record is not None else time.time()
    left = pause - (time.time() - last_end)
    if left <= 0:
        return None
    return (
        f"{what}: {deaths} runs died without its code failing (killed, orphaned, or a service unreachable); "
        f"next attempt in {left:.0f} s (backoff {pause:.0f} s)"
    )


def unavailable_service(error: BaseException | None) -> str | None:
    """ "kafka" or "spark" when `error`, or an error it was raised from, says that service could not be reached (a
    broker or Spark Connect server restarting: the batch is not at fault); None for anything else, which counts."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
            if error.args[0].retriable() or error.args[0].code() in KAFKA_UNREACHABLE:
                return "kafka"
        if isinstance(error, SparkConnectException):
            text = str(error)
            if error.getCondition() == "NO_ACTIVE_SESSION" or any(s in text for s in SPARK_UNREACHABLE):
                return "spark"
        error = error.__cause__ or error.__context__
    return None


def unless_unavailable(evaluate: Callable[[], T]) -> T | SkipReason:
    """A sensor's evaluation that meets an unreachable broker or Spark server skips the tick and says so instead
    of failing it: a restarting service is not the sensor's fault, and the next tick asks again. Any other error
    still fails the tick."""
    try:
        return evaluate()
    except Exception as e:  # noqa: BLE001 - re-raised unless it names an unreachable service
        service = unavailable_service(e)
        if service is None:
            raise
        return SkipReason(f"{service} unreachable, the next tick asks again: {type(e).__name__}: {str(e)[:300]}")


def resume_unfinished(
    context: SensorEvaluationContext,
    latest: BatchPlan,
    partitions: DynamicPartitionsDefinition,
    tags: Callable[[BatchPlan], dict[str, str]],
    cursor: str,
    turn_wait: TurnWait | None = None,
    liveness: CoordinatorResource | None = None,
) -> SensorResult | SkipReason:
    """The sensor's answer while `latest` is planned but not done. A run of it in flight whose process
    is gone (asked of `liveness`: no liveness node) is marked failed first, and retried. Before a
    (re)request, `turn_wait` holds it while the lock is held, and after a coordination give-up also
    while the predecessor rule would refuse it, so a stream waiting for its turn skips ticks instead of
    launching runs that wait."""
    filters = RunsFilter(tags={"dagster/partition": latest.partition_key, STREAM_TAG: latest.stream})
    runs = context.instance.get_runs(filters=filters)
    unfinished = [r for r in runs if r.status in UNFINISHED]
    if unfinished:
        in_flight, note = reap_orphans(context.instance, unfinished, liveness)
        if in_flight:
            return SkipReason(f"{latest.stream} batch {latest.batch_id} is in flight" + (f" ({note})" if note else ""))
        runs = context.instance.get_runs(filters=filters)  # the orphans are failed now
    ended = [r for r in runs if r.status in FAILED]
    failed = sum(counts_as_attempt(r) for r in ended)  # coordination give-ups and orphans are not attempts
    if failed >= MAX_ATTEMPTS:
        return SkipReason(
            f"{latest.stream} batch {latest.batch_id} failed {failed} times; "
            f"stream paused until partition {latest.partition_key} is re-executed"
        )
    last = ended[0] if ended else None  # get_runs lists the newest first
    backing_off = backoff_wait(context.instance, ended, f"{latest.stream} batch {latest.batch_id}")
    if backing_off:
        return SkipReason(backing_off)
    if turn_wait is not None:
        reason = turn_wait(latest, last is not None and last.tags.get(COORDINATION_TAG) == "gave_up")
        if reason:
            return SkipReason(waits_for_its_turn(latest, reason))
    return SensorResult(
        run_requests=[run_request(latest, len(ended) + 1, {**tags(latest), **retry_tags(last)})],
        dynamic_partitions_requests=[partitions.build_add_request([latest.partition_key])],
        cursor=cursor,
    )


def waits_for_its_turn(plan: BatchPlan, reason: str) -> str:
    """A sensor's skip reason while a batch waits for its turn (the lock, the predecessor rule)."""
    return f"{plan.stream} batch {plan.batch_id} waits for its turn: {reason}"


def report_table_commits(
    context: AssetExecutionContext, stream: str, batch_id: int, versions: dict[str, int | None], **extra: Any
) -> None:
    """A stream run reports a materialization of each table it committed (the tables are downstream assets)."""
    for table, version in versions.items():
        context.log_event(
            AssetMaterialization(
                asset_key=table,
                description=f"{stream} batch {batch_id}",
                metadata={
                    "batch_id": batch_id,
                    "table_version": version if version is not None else "already committed",
                    "stream": stream,
                    **extra,
                },
            )
        )


@contextmanager
def coordination_failures(context: AssetExecutionContext, what: str, then: str, **metadata: Any) -> Iterator[None]:
    """A give-up or a lost lease inside the block ends the run as a Failure tagged COORDINATION_TAG
    (not retried by Dagster: the sensor decides), saying `what` gave up and what happens `then`; a broker or
    Spark server that could not be reached, as a Failure tagged UNAVAILABLE_TAG. Neither counts as an attempt."""
    try:
        yield
    except (CoordinationGaveUp, LeaseLost) as e:
        outcome = "gave_up" if isinstance(e, CoordinationGaveUp) else "lease_lost"
        context.instance.add_run_tags(context.run_id, {COORDINATION_TAG: outcome})
        raise Failure(
            description=f"{what} {outcome.replace('_', ' ')}: {e}. Nothing more was committed{then}.",
            metadata={"coordination": outcome, "reason": str(e), **metadata},
            allow_retries=False,
        ) from e
    except Exception as e:  # a broker or Spark server away mid-batch: exactly-once re-runs it; it is no attempt
        service = unavailable_service(e)
        if service is None:
            raise
        context.instance.add_run_tags(context.run_id, {UNAVAILABLE_TAG: service})
        raise Failure(
            description=f"{what}: {service} unavailable: {str(e)[:500]}. The batch is retried from its plan{then}.",
            metadata={"unavailable": service, **metadata},
            allow_retries=False,
        ) from e


@contextmanager
def coordinated_batch(
    context: AssetExecutionContext, coordinator: CoordinatorResource, stream: str, lock_name: str | None = None
) -> Iterator[Lease | None]:
    """acquire -> the block (compute and commit, fenced by the lease) -> release, for the run's
    partition (= batch id). While the lock is held by someone else the run waits (a log line per
    round of the lock timeout) up to the coordinator's `max_lock_wait_s`; the seconds it waited
    become the materialization's LOCK_WAIT_METADATA (ride_out.run_riding_out_faults sums its attempts'). A predecessor refusal whose bounded wait ends within
    that patience is waited out (acquire_in_turn). A give-up (after that bound, or the predecessor
    rule beyond it, or ZooKeeper away) or a lost lease is raised: inside ride_out.run_riding_out_faults it ends the
    run as a Failure tagged COORDINATION_TAG (nothing more is committed and a later tick retries the same
    plan), unless it is a passing fault that the run rides out."""
    batch_id = int(context.partition_key)

    def waiting(busy: LockBusy, waited_s: float) -> None:
        context.log.info(
            f"{stream} batch {batch_id} waits for its turn: lock {busy.lock_name} held by {holder_owner(busy.holder or 'unknown')} "
            f"({waited_s:.0f}s so far, gives up after {coordinator.max_lock_wait_s:g}s)"
        )

    with ExitStack() as held:
        lease = held.enter_context(acquire_in_turn(context, coordinator, stream, batch_id, lock_name, waiting))
        with fenced(lease):
            if lease is not None:
                context.log.info(
                    f"{stream} batch {batch_id}: holding {lease} after waiting {lease.waited_s:.1f}s for it"
                )
            yield lease


PREDECESSOR_ROUND_S = 15.0  # longest sleep between two registrations of a run the predecessor rule refused


@contextmanager
def acquire_in_turn(
    context: AssetExecutionContext,
    coordinator: CoordinatorResource,
    stream: str,
    batch_id: int,
    lock_name: str | None,
    on_lock_wait: Callable[[LockBusy, float], None],
) -> Iterator[Lease | None]:
    """The coordinator's batch, entered once the predecessor rule lets the batch in. A refusal whose
    bounded wait ends within the run's patience (`max_lock_wait_s`) is waited out with the lock released
    (the predecessor must be free to run), since the rule admits any batch once the wait ends; a refusal
    beyond it (or unbounded) gives up as before."""
    started = time.monotonic()
    while True:
        entered = False
        try:
            with coordinator.batch(stream, batch_id, lock_name, on_lock_wait=on_lock_wait) as lease:
                entered = True
                yield lease
            return
        except PredecessorRefused as refused:
            if entered or refused.wait_s is None:
                raise
            waited = time.monotonic() - started
            if waited + refused.wait_s > coordinator.max_lock_wait_s:
                raise
            pause = min(max(refused.wait_s, 0.5), PREDECESSOR_ROUND_S)
            context.log.info(f"{stream} batch {batch_id} waits for its turn: {refused} ({waited:.0f}s so far)")
            time.sleep(pause)


def cursor_ahead_of_store(cursor: str | None, stream: str, latest: BatchPlan | None) -> str | None:
    """Why a sensor must not plan: its JSON cursor names a batch the checkpoint store never planned.

    A sensor records each plan before it returns the cursor naming it, so the store knows every batch a
    cursor names. A cursor ahead of the store means the lake was reset or the lake resource points at
    another lake. Planning batch 1 again there would re-read the source into it under partition keys and
    run keys this Dagster instance already used (a run request with a used run key is silently dropped,
    so the stream would stall without a word); skipping with this reason says what to do instead."""
    if not cursor:
        return None
    named = json.loads(cursor).get("batch_id")
    known = latest.batch_id if latest is not None else 0
    if not isinstance(named, int) or named <= known:
        return None
    return (
        f"{stream}: the sensor's cursor names batch {named} but the checkpoint store's latest batch is {known or 'none'}: "
        f"the lake was reset or the lake resource points at another lake. Reset this sensor's cursor to start {stream} over in this lake."
    )
