"""Which errors say a service was unreachable (the batch is retried without counting an attempt) and which count:
the error chain is followed, and only transport-level failures of the broker or the Spark Connect server qualify."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from pyspark.errors.exceptions.connect import SparkConnectException, SparkConnectGrpcException

from engagement_platform.orchestration.runs import unavailable_service


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
