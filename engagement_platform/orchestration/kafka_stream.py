"""A Kafka-fed stream in Dagster, built from one definition: the topic (an observable source asset), the
stream (an asset partitioned by batch: one dynamic partition per planned slice), its in-process job, its
sensor and its checks (offset contiguity always, plus those the stream names: records conserved,
notifications match changes, its own). Adding a stream is one `build_kafka_stream` call.

The stream's run: the planned slice of its partition -> `spec.run_batch` (inside the coordinator's lock and
predecessor rule when the spec names a lock) -> a materialization of each table it committed -> its
metadata and check results. The sensor: resume the unfinished batch (runs.resume_unfinished), else plan the
next slice up to the high watermarks, record it and request its run (run key = the slice). A stream with a
lock requests no run while the lock is held: the tick skips saying who holds it, and plans on a later tick.
Every run holds a liveness node in ZooKeeper; the sensor fails a run in flight whose node is gone (orphans.py).
"""

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    DefaultSensorStatus,
    DynamicPartitionsDefinition,
    MaterializeResult,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    SourceAsset,
    asset,
    define_asset_job,
    in_process_executor,
    sensor,
)

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.orchestration.checks import BatchChecks, check_specs, evaluate_checks, offset_ranges_contiguous
from engagement_platform.orchestration.orphans import liveness_probe, run_liveness, stranded_metadata
from engagement_platform.orchestration.reported import unreported
from engagement_platform.orchestration.ride_out import run_riding_out_faults, spark_reconnect
from engagement_platform.orchestration.runs import (
    STREAM_TAG,
    TurnWait,
    cursor_ahead_of_store,
    report_table_commits,
    resume_unfinished,
    run_request,
    unless_unavailable,
    waits_for_its_turn,
)
from engagement_platform.orchestration.topics import ObservationMetadata, Watermarks, topic_asset, topic_observation
from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource, SparkResource
from engagement_platform.settings import load_settings
from engagement_platform.streams.cadence import Cadence, reached_bound
from engagement_platform.streams.planning import BatchPlan, plan_next_batch, uncommitted_records
from engagement_platform.streams.spec import BatchContext, BatchResult, StreamSpec

RECORDS_TAG = "engagement/records"  # on every run: the records its slice holds


@dataclass(frozen=True)
class IdleRun:
    """What a stream runs when its topic has nothing new: a plan, extra run tags, a run key suffix naming why."""

    plan: BatchPlan
    tags: Mapping[str, str]
    run_key_suffix: str


# With no new messages: (checkpoints, latest plan, watermarks) -> the run to request anyway, or None to skip.
IdlePlan = Callable[[CheckpointStore, BatchPlan | None, Watermarks], IdleRun | None]
# Before the tick reads anything: a reason to skip it (a cadence), or None.
TickGate = Callable[[CheckpointStore], str | None]


@dataclass(frozen=True)
class KafkaStreamDefinition:
    """Everything Dagster needs to know about a Kafka-fed stream; names default from the asset key."""

    spec: StreamSpec
    asset_key: AssetKey
    topic_asset_key: AssetKey
    topic: Callable[[], str]  # read at run time (settings), never at import time
    description: str  # the stream asset's: what each partition is, for the UI
    topic_description: str
    group: str
    kinds: frozenset[str] = frozenset({"deltalake", "kafka"})
    pool: str | None = None  # a concurrency pool its runs share with other writers (dagster.yaml)
    checks: Sequence[BatchChecks] = ()  # besides offset_ranges_contiguous, which every Kafka stream has
    job_description: str = ""
    sensor_description: str = ""
    minimum_interval_seconds: int = 5
    idle_plan: IdlePlan | None = None
    tick_gate: TickGate | None = None
    observation_metadata: ObservationMetadata | None = None  # figures the topic's observations add
    partitions_name: str | None = None  # default "<asset>_batches"
    job_name: str | None = None  # default "<asset>_job"
    sensor_name: str | None = None  # default "<asset>_sensor"

    @property
    def name(self) -> str:
        return self.asset_key.to_python_identifier()

    @property
    def all_checks(self) -> list[BatchChecks]:
        return [offset_ranges_contiguous(), *self.checks]


@dataclass(frozen=True)
class KafkaStream:
    """The Dagster definitions of one stream; `assets`, `jobs` and `sensors` go into the Definitions."""

    definition: KafkaStreamDefinition
    partitions: DynamicPartitionsDefinition
    topic_asset: SourceAsset
    asset: AssetsDefinition  # with the stream's check specs
    job: Any  # define_asset_job's (unresolved) job: its class is not public
    sensor: SensorDefinition

    @property
    def assets(self) -> list[AssetsDefinition | SourceAsset]:
        return [self.topic_asset, self.asset]

    @property
    def jobs(self) -> list:
        return [self.job]

    @property
    def sensors(self) -> list[SensorDefinition]:
        return [self.sensor]


def build_kafka_stream(definition: KafkaStreamDefinition) -> KafkaStream:
    partitions = DynamicPartitionsDefinition(name=definition.partitions_name or f"{definition.name}_batches")
    topic = topic_asset(
        definition.topic_asset_key,
        definition.topic,
        definition.topic_description,
        definition.group,
        definition.observation_metadata,
    )
    stream_asset = _stream_asset(definition, partitions)
    job = define_asset_job(
        definition.job_name or f"{definition.name}_job",
        selection=AssetSelection.assets(definition.asset_key),
        partitions_def=partitions,
        # In-process: Spark is a long-lived Connect server, and a subprocess per step would pay Python + imports.
        executor_def=in_process_executor,
        tags={STREAM_TAG: definition.spec.name},
        description=definition.job_description or None,
    )
    return KafkaStream(definition, partitions, topic, stream_asset, job, _stream_sensor(definition, partitions, job))


def _stream_asset(definition: KafkaStreamDefinition, partitions: DynamicPartitionsDefinition) -> AssetsDefinition:
    checks = definition.all_checks
    decorate = asset(
        key=definition.asset_key,
        deps=[definition.topic_asset_key],
        partitions_def=partitions,
        check_specs=check_specs(checks, definition.asset_key),
        group_name=definition.group,
        kinds=set(definition.kinds),
        pool=definition.pool,
        description=definition.description,
    )
    own_table = definition.asset_key.to_user_string()  # a stream whose asset is its table reports it once, as itself

    def run(
        context: AssetExecutionContext,
        spark: SparkResource,
        lake: LakeResource,
        kafka: KafkaResource,
        checkpoints: CheckpointStore,
        coordinator: CoordinatorResource | None,
    ) -> MaterializeResult:
        spec = definition.spec
        plan = checkpoints.plan(spec.name, int(context.partition_key))

        def attempt() -> BatchResult:  # a new context per attempt: the Spark session may be a new one
            batch = BatchContext(
                spark.spark_session,
                lake.lake,
                checkpoints,
                kafka.servers,
                coordinator.coordinator() if coordinator is not None and coordinator.is_enabled else None,
            )
            return spec.run_batch(batch, plan)

        # With a coordinator: lock (waiting its turn, the wait in the metadata) + predecessor, fenced commits, unlock.
        result = run_riding_out_faults(
            context, spec.name, attempt, coordinator, spec.lock_name, on_fault=spark_reconnect(spark)
        )
        report_table_commits(
            context, spec.name, plan.batch_id, {t: v for t, v in result.versions.items() if t != own_table}
        )
        return MaterializeResult(
            metadata={**result.metadata(), **stranded_metadata(context)},
            check_results=evaluate_checks(checks, lake.lake, checkpoints, result),
        )

    if definition.spec.lock_name is None:
        # No lock (an append-only stream: delta-rs never fails a blind append on a concurrent commit), so
        # no coordinator either; exactly-once comes from the batch's txn, order from one run per stream.
        # Its run's liveness node is held on a session of its own (the run takes no CoordinatorResource).
        def unlocked(
            context: AssetExecutionContext, spark: SparkResource, lake: LakeResource, kafka: KafkaResource
        ) -> MaterializeResult:
            with run_liveness(context, lake):
                return run(context, spark, lake, kafka, lake.checkpoints, None)

        return decorate(unlocked)

    def locked(
        context: AssetExecutionContext,
        spark: SparkResource,
        lake: LakeResource,
        kafka: KafkaResource,
        coordinator: CoordinatorResource,
    ) -> MaterializeResult:
        return run(context, spark, lake, kafka, coordinator.checkpoints, coordinator)

    return decorate(locked)


def _stream_sensor(
    definition: KafkaStreamDefinition, partitions: DynamicPartitionsDefinition, job: Any
) -> SensorDefinition:
    decorate = sensor(
        name=definition.sensor_name or f"{definition.name}_sensor",
        job=job,
        minimum_interval_seconds=definition.minimum_interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description=definition.sensor_description or None,
    )
    if definition.spec.lock_name is None:
        # Only the checkpoint store is needed: a stream without a lock never gives up on coordination
        # (its runs' liveness is asked of ZooKeeper as the settings name it).
        def unlocked(
            context: SensorEvaluationContext, kafka: KafkaResource, lake: LakeResource
        ) -> SensorResult | SkipReason:
            return unless_unavailable(
                lambda: kafka_stream_tick(
                    context, definition, partitions, kafka, lake.checkpoints, None, liveness_probe(lake)
                )
            )

        return decorate(unlocked)

    def locked(
        context: SensorEvaluationContext, kafka: KafkaResource, coordinator: CoordinatorResource
    ) -> SensorResult | SkipReason:
        def turn_wait(plan: BatchPlan, after_give_up: bool) -> str | None:
            ask = coordinator.predecessor_wait if after_give_up else coordinator.lock_wait
            return ask(plan.stream, plan.batch_id, definition.spec.lock_name)

        def pass_turn() -> str | None:
            return coordinator.pass_turn(definition.spec.name, definition.spec.lock_name)

        return unless_unavailable(
            lambda: kafka_stream_tick(
                context, definition, partitions, kafka, coordinator.checkpoints, turn_wait, coordinator, pass_turn
            )
        )

    return decorate(locked)


def _tags(plan: BatchPlan) -> dict[str, str]:
    return {RECORDS_TAG: str(plan.record_count)}


def batch_cursor(plan: BatchPlan) -> str:
    """The sensor's JSON cursor after it planned a batch: the batch and where the next slice starts (ticks that
    plan nothing add what they reported, orchestration/reported.py)."""
    return json.dumps({"batch_id": plan.batch_id, "next_offsets": {str(p): e for p, e in plan.ends().items()}})


def cadence_wait(
    cadence: Cadence, plan: BatchPlan, previous_planned_at: datetime | None, max_records_per_partition: int
) -> str | None:
    """The cadence's reason to hold a new slice back, or None (`previous_planned_at`: None when the stream never planned)."""
    full = reached_bound((r.size for r in plan.ranges), max_records_per_partition)
    waited = (datetime.now(UTC) - previous_planned_at).total_seconds() if previous_planned_at is not None else None
    return cadence.wait_reason(plan.record_count, full, waited)


def kafka_stream_tick(
    context: SensorEvaluationContext,
    definition: KafkaStreamDefinition,
    partitions: DynamicPartitionsDefinition,
    kafka: KafkaResource,
    store: CheckpointStore,
    turn_wait: TurnWait | None,
    liveness: CoordinatorResource | None = None,
    pass_turn: Callable[[], str | None] | None = None,
) -> SensorResult | SkipReason:
    """One tick: the gate, the cursor against the store, then resume the unfinished batch (failing its run
    if `liveness` finds the run's process gone), or plan the next
    slice (or, with no new messages, what `idle_plan` asks for) unless `turn_wait` says its run would wait:
    then nothing is recorded, and a later tick plans the slice up to the watermarks it sees then. A tick that
    finds the topic fully committed calls `pass_turn` (a job waiting for this stream's fresh records need not)."""
    stream = definition.spec.name
    if definition.tick_gate is not None:
        reason = definition.tick_gate(store)
        if reason:
            return SkipReason(reason)
    state = store.latest_batches([stream])[stream]  # one read: the plan, whether it is done, when it was planned
    latest, done = state.plan, state.done
    # The cursor is read only to catch a lake that is not the one it planned in: the checkpoint store,
    # not the cursor, says where the stream stands, so a lost cursor never skips or repeats a slice.
    ahead = cursor_ahead_of_store(context.cursor, stream, latest)
    if ahead:
        return SkipReason(ahead)
    if latest is not None and not done:
        return resume_unfinished(context, latest, partitions, _tags, batch_cursor(latest), turn_wait, liveness)
    topic = definition.topic()
    watermarks = kafka.client.watermarks(topic)
    extra = definition.observation_metadata(store, watermarks) if definition.observation_metadata is not None else {}
    # Records produced but not committed by this stream: plotted on the topic asset. The observation is reported
    # only when one of its figures changed since the report the cursor records: an idle tick writes nothing.
    extra = {f"{stream}_uncommitted_records": uncommitted_records(latest, done, watermarks), **extra}
    observed, reported_cursor = unreported(
        context.cursor, [topic_observation(watermarks, definition.topic_asset_key, extra)]
    )
    settings = load_settings()
    plan = plan_next_batch(stream, topic, latest, watermarks, settings.max_records_per_partition)
    idle = (
        definition.idle_plan(store, latest, watermarks) if plan is None and definition.idle_plan is not None else None
    )
    plan = idle.plan if idle is not None else plan
    if plan is None:
        passed = pass_turn() if pass_turn is not None else None
        return SensorResult(
            skip_reason=f"no new messages on {topic} (high watermarks {dict(sorted((p, h) for p, (_, h) in watermarks.items()))})"
            + (f"; {passed}" if passed else ""),
            asset_events=observed,
            cursor=reported_cursor,
        )
    if idle is None:
        not_due = cadence_wait(settings.cadence(stream), plan, state.planned_at, settings.max_records_per_partition)
        if not_due:
            return SensorResult(skip_reason=not_due, asset_events=observed, cursor=reported_cursor)
    # A new batch's run is launched only when it would get in: the lock free and the predecessor rule
    # satisfied (or its bounded wait over), so waiting one's turn is a skipped tick, not a red run.
    reason = turn_wait(plan, True) if turn_wait is not None else None
    if reason:
        return SensorResult(skip_reason=waits_for_its_turn(plan, reason), asset_events=observed, cursor=reported_cursor)
    # A planning tick's cursor is the batch's alone, what was reported forgotten: once the batch is done its records
    # count as committed, so a report is due then anyway (after an empty retry slice, the same figures once more).
    store.record_plan(plan)
    request = run_request(plan, 1, {**_tags(plan), **(idle.tags if idle is not None else {})})
    if idle is not None and idle.run_key_suffix:
        # plan.run_key is the key run_request gave the first attempt
        request = request.with_replaced_attrs(run_key=plan.run_key + idle.run_key_suffix)
    return SensorResult(
        run_requests=[request],
        asset_events=observed,
        dynamic_partitions_requests=[partitions.build_add_request([plan.partition_key])],
        cursor=batch_cursor(plan),
    )
