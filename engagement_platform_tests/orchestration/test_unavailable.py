"""Which errors say a service was unreachable (the batch is retried without counting an attempt) and which count:
the error chain is followed, and only transport-level failures of the broker or the Spark Connect server qualify.
Sensors that meet an unreachable broker (one restarting) skip their tick saying so instead of failing it."""

from __future__ import annotations

import socket

import pytest
from confluent_kafka import KafkaError, KafkaException
from dagster import DagsterInstance, SkipReason, build_sensor_context
from pyspark.errors.exceptions.connect import SparkConnectException, SparkConnectGrpcException, UnknownException

from engagement_platform.orchestration.runs import unavailable_service, unless_unavailable


def raised_from(outer: type[BaseException], inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as cause:
            raise outer("while committing the batch") from cause
    except BaseException as error:
        return error


def test_a_broker_or_spark_server_away_is_unavailable_anywhere_in_the_chain():
    assert unavailable_service(KafkaException(KafkaError(KafkaError._TRANSPORT))) == "kafka"
    assert unavailable_service(KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN))) == "kafka"
    assert unavailable_service(raised_from(RuntimeError, KafkaException(KafkaError(KafkaError._TIMED_OUT)))) == "kafka"
    assert unavailable_service(SparkConnectException(errorClass="NO_ACTIVE_SESSION", messageParameters={})) == "spark"
    assert (
        unavailable_service(
            raised_from(
                ValueError,
                SparkConnectGrpcException(
                    "<_MultiThreadedRendezvous of RPC that terminated with: status = StatusCode.UNAVAILABLE>"
                ),
            )
        )
        == "spark"
    )
    # A Spark Connect server shutting down under a running query: not an attempt of the batch.
    assert (
        unavailable_service(
            raised_from(
                RuntimeError,
                UnknownException(
                    "(java.lang.IllegalStateException) Cannot call methods on a stopped SparkContext.\n"
                    "This stopped SparkContext was created at:\n\norg.apache.spark.sql.connect.service.SparkConnectServer.main"
                ),
            )
        )
        == "spark"
    )
    # A client whose server restarted between two of its calls (a new client works).
    assert (
        unavailable_service(
            SparkConnectGrpcException(
                "[INVALID_HANDLE.SESSION_CHANGED] The handle 4e7c is invalid. The existing Spark server driver instance has restarted."
            )
        )
        == "spark"
    )


def test_errors_of_the_batch_itself_count():
    assert unavailable_service(ValueError("bad row")) is None
    assert unavailable_service(None) is None
    assert unavailable_service(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))) is None
    assert unavailable_service(SparkConnectGrpcException("[UNRESOLVED_COLUMN] A column cannot be resolved")) is None
    assert unavailable_service(raised_from(RuntimeError, ZeroDivisionError("x"))) is None


def test_unless_unavailable_skips_on_an_unreachable_service_and_lets_other_errors_fail():
    def broker_away():
        raise RuntimeError("reading watermarks") from KafkaException(KafkaError(KafkaError._TRANSPORT))

    skipped = unless_unavailable(broker_away)
    assert isinstance(skipped, SkipReason) and skipped.skip_message.startswith(
        "kafka unreachable, the next tick asks again"
    )
    assert unless_unavailable(lambda: 7) == 7
    with pytest.raises(ZeroDivisionError):
        unless_unavailable(lambda: 1 / 0)


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens once the socket is closed


@pytest.mark.stack  # waits out the clients' give-up on a server that is away: the stack tier, not the unit tier
def test_sensors_skip_their_tick_while_the_broker_is_unreachable(tmp_path):
    """The real sensors against a broker address where nothing listens: a Kafka stream's sensor (the profile
    erasure stream) and the profile lag sensor skip with the reason instead of failing."""
    from engagement_platform.profiles.assets import profile_tenants
    from engagement_platform.profiles.erasure.assets import PROFILE_ERASURE
    from engagement_platform.profiles.processor.checks import EVERY_TENANT_LAG_UNDER_THRESHOLD
    from engagement_platform.profiles.processor.sensors import profile_lag_sensor
    from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource

    lake = LakeResource(root=str(tmp_path / "lake"))
    resources = {
        "kafka": KafkaResource(bootstrap_servers=closed_port()),
        "lake": lake,
        "coordinator": CoordinatorResource(lake=lake, enabled=False),
    }
    (erasure_sensor,) = PROFILE_ERASURE.sensors
    with DagsterInstance.ephemeral() as instance:
        for sensor_def in (erasure_sensor, profile_lag_sensor):
            with build_sensor_context(instance=instance, resources=resources) as ctx:
                result = sensor_def(ctx)
            reason = result.skip_message if isinstance(result, SkipReason) else result.skip_reason.skip_message
            assert reason.startswith("kafka unreachable"), (sensor_def.name, reason)
        # with tenants, the lag check (from the lake alone) is still reported: lag grows while the broker is away
        instance.add_dynamic_partitions(profile_tenants.name, ["acme"])
        with build_sensor_context(instance=instance, resources=resources) as ctx:
            result = profile_lag_sensor(ctx)
        (evaluation,) = result.asset_events
        assert evaluation.check_name == EVERY_TENANT_LAG_UNDER_THRESHOLD and result.skip_reason.skip_message.startswith(
            "kafka unreachable"
        )


def test_a_spark_fault_gives_the_run_a_new_client_of_the_shared_session(stack):
    """Riding out a Spark fault (a server restart: its channel and the server-side session the client knew are
    gone), the run's next attempt uses a new client of the shared session, configured again, and the old one is
    closed and forgotten; other passing faults keep the session."""
    from engagement_platform.orchestration.ride_out import spark_reconnect
    from engagement_platform.resources import SparkResource

    resource = SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]})
    old = resource.spark_session
    assert old.range(3).count() == 3
    spark_reconnect(resource)("lease lost")
    assert resource.spark_session is old
    spark_reconnect(resource)("spark unavailable")
    new = resource.spark_session
    assert new is not old and old.client.is_closed and not new.client.is_closed
    assert new.range(4).count() == 4 and new.conf.get("spark.sql.session.timeZone") == "UTC"


def test_a_stream_without_a_lock_rides_out_a_spark_fault_and_past_the_bound_fails_without_using_an_attempt(
    tmp_path, monkeypatch
):
    """A stream without a lock (no coordinator: profile CDC staging) whose Spark is away (NO_ACTIVE_SESSION) must
    not fail with the raw error, which would count towards the 3 attempts that pause a stream. Its run rides the
    fault out like a locked stream's, and past the bound fails tagged engagement/unavailable."""
    from dagster import AssetKey, DagsterInstance, materialize

    from engagement_platform.lake.checkpoints import CheckpointStore
    from engagement_platform.lake.delta import DeltaLake
    from engagement_platform.orchestration import ride_out
    from engagement_platform.orchestration.runs import UNAVAILABLE_TAG, counts_as_attempt
    from engagement_platform.resources import KafkaResource, LakeResource
    from engagement_platform.streams.kafka import OffsetRange
    from engagement_platform.streams.planning import BatchPlan, KafkaSlice
    from engagement_platform_tests.support.streams import NoSpark, clicks_stream, count_clicks

    monkeypatch.setenv("EP_COORDINATOR", "off")  # no ZooKeeper here: the run holds no liveness node
    monkeypatch.setattr(ride_out, "RIDE_OUT_PAUSES_S", (0.1,))
    away = SparkConnectGrpcException(
        "<_MultiThreadedRendezvous of RPC that terminated with: status = StatusCode.UNAVAILABLE>"
    )

    def run(faults: int, lake_root: str):
        calls = []

        def spark_away_at_first(ctx, plan):
            calls.append(plan.batch_id)
            if len(calls) <= faults:
                raise RuntimeError("reading the slice") from away
            return count_clicks(ctx, plan)

        stream = clicks_stream(run_batch=spark_away_at_first)
        plan = BatchPlan("clicks", 1, KafkaSlice("demo.clicks", (OffsetRange(0, 0, 5),)))
        CheckpointStore(DeltaLake(lake_root)).record_plan(plan)
        with DagsterInstance.ephemeral() as instance:
            instance.add_dynamic_partitions(stream.partitions.name, [plan.partition_key])
            out = materialize(
                [stream.asset],
                partition_key=plan.partition_key,
                instance=instance,
                raise_on_error=False,
                resources={
                    "spark": NoSpark(),
                    "lake": LakeResource(root=lake_root),
                    "kafka": KafkaResource(bootstrap_servers="unused:9092"),
                },
            )
            return out, instance.get_run_by_id(out.run_id), len(calls)

    out, _, calls = run(faults=2, lake_root=str(tmp_path / "a"))
    assert out.success and calls == 3
    (metadata,) = [
        m.metadata for m in out.asset_materializations_for_node("demo_clicks") if m.asset_key == AssetKey("demo_clicks")
    ]
    assert metadata["attempts_in_run"].value == 3

    monkeypatch.setattr(ride_out, "RIDE_OUT_S", 0.0)
    out, failed, calls = run(faults=99, lake_root=str(tmp_path / "b"))
    assert not out.success and calls == 1
    assert failed.tags[UNAVAILABLE_TAG] == "spark" and not counts_as_attempt(failed)
