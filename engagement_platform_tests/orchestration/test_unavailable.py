"""Which errors say a service was unreachable (the batch is retried without counting an attempt) and which count:
the error chain is followed, and only transport-level failures of the broker or the Spark Connect server qualify.
Sensors that meet an unreachable broker skip their tick saying so instead of failing it (seen in the soak while
the broker restarted: the erasure and lag sensors' ticks failed)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from pyspark.errors.exceptions.connect import SparkConnectException, SparkConnectGrpcException

import socket

import pytest
from dagster import DagsterInstance, SkipReason, build_sensor_context

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
    assert unavailable_service(raised_from(ValueError, SparkConnectGrpcException(
        "<_MultiThreadedRendezvous of RPC that terminated with: status = StatusCode.UNAVAILABLE>"))) == "spark"


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
    assert isinstance(skipped, SkipReason) and skipped.skip_message.startswith("kafka unreachable, the next tick asks again")
    assert unless_unavailable(lambda: 7) == 7
    with pytest.raises(ZeroDivisionError):
        unless_unavailable(lambda: 1 / 0)


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens once the socket is closed


def test_sensors_skip_their_tick_while_the_broker_is_unreachable(tmp_path):
    """The real sensors against a broker address where nothing listens: a Kafka stream's sensor (the profile
    erasure stream, as in the soak) and the profile lag sensor skip with the reason instead of failing."""
    from engagement_platform.profiles.assets import profile_tenants
    from engagement_platform.profiles.erasure.assets import PROFILE_ERASURE
    from engagement_platform.profiles.processor.checks import EVERY_TENANT_LAG_UNDER_THRESHOLD
    from engagement_platform.profiles.processor.sensors import profile_lag_sensor
    from engagement_platform.resources import CoordinatorResource, KafkaResource, LakeResource

    lake = LakeResource(root=str(tmp_path / "lake"))
    resources = {"kafka": KafkaResource(bootstrap_servers=closed_port()), "lake": lake,
                 "coordinator": CoordinatorResource(lake=lake, enabled=False)}
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
        assert evaluation.check_name == EVERY_TENANT_LAG_UNDER_THRESHOLD and result.skip_reason.skip_message.startswith("kafka unreachable")
