"""Kafka security settings reach every Kafka client of the platform from one place (KAFKA_CONFIG_* in the
environment -> settings.kafka_config): the sensors' client (watermarks), the Spark tasks' readers (the
driver ships the settings with the plan: executors do not share its environment), and the CLI's clients.
Proved with a setting librdkafka refuses by name, so each client shows it received it; then a valid
setting (client.id) leaves ingestion working."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from confluent_kafka import KafkaException

from engagement_platform.engagement.ingestion.apply import STREAM, ingest_batch
from engagement_platform.engagement.ingestion.records import ingestion_pipeline
from engagement_platform.ingest.pipeline import validated_kafka_frame
from engagement_platform.resources import KafkaResource
from engagement_platform.settings import kafka_config_from
from engagement_platform.streams.planning import plan_next_batch
from engagement_platform_tests.support.activities import produce_activities

PROBE = "ep.probe.not.a.setting"


def test_kafka_config_comes_from_prefixed_environment_variables():
    env = {
        "KAFKA_CONFIG_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_CONFIG_SASL_MECHANISM": "PLAIN",
        "KAFKA_CONFIG_SASL_PASSWORD": "p",
        "KAFKA_CONFIG_EMPTY": "",
        "OTHER": "x",
    }
    assert kafka_config_from(env) == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.password": "p"}


def test_a_setting_reaches_the_sensor_the_spark_tasks_and_the_cli(stack, kafka, topic, spark, monkeypatch):
    produce_activities(kafka, topic, 20)
    plan = plan_next_batch(STREAM, topic, None, kafka.watermarks(topic), 1000)
    monkeypatch.setenv("KAFKA_CONFIG_EP_PROBE_NOT_A_SETTING", "1")

    with pytest.raises(KafkaException, match=PROBE):  # the sensors' client
        KafkaResource(bootstrap_servers=kafka.bootstrap_servers).client.watermarks(topic)
    with pytest.raises(Exception, match=PROBE):  # the Spark tasks' reader, configured by the driver
        validated_kafka_frame(spark, ingestion_pipeline(topic), kafka.bootstrap_servers, plan).toArrow()
    cli = subprocess.run(
        [sys.executable, "-m", "engagement_platform.cli", "create-topics"],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode != 0 and PROBE in cli.stderr, cli.stderr[-2000:]


def test_a_valid_setting_leaves_ingestion_working(stack, kafka, topic, spark, lake, checkpoints, monkeypatch):
    expected = produce_activities(kafka, topic, 30)
    monkeypatch.setenv("KAFKA_CONFIG_CLIENT_ID", "engagement-platform-test")
    plan = plan_next_batch(
        STREAM, topic, None, KafkaResource(bootstrap_servers=kafka.bootstrap_servers).client.watermarks(topic), 1000
    )
    assert checkpoints.record_plan(plan)
    result = ingest_batch(spark, lake, checkpoints, kafka.bootstrap_servers, plan)
    assert result.rows_appended == len(expected)


def self_signed(tmp_path):
    """A PEM certificate and its key, as files (what a deployment names with ssl.*.location)."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "broker.test")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "client.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "client.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def test_tls_files_named_on_the_driver_reach_the_spark_tasks_as_their_contents(tmp_path):
    """An executor on another node has no copy of the driver's certificate files: the tasks get the PEM texts
    (librdkafka's ssl.*.pem), which librdkafka accepts as it accepts the files. A CA folder stays a path."""
    from confluent_kafka import Consumer

    from engagement_platform.streams.kafka_files import for_executors

    self_signed(tmp_path)
    driver = {
        "security.protocol": "SSL",
        "ssl.ca.location": str(tmp_path / "ca.pem"),
        "ssl.certificate.location": str(tmp_path / "client.pem"),
        "ssl.key.location": str(tmp_path / "client.key"),
    }
    tasks = for_executors(driver)
    assert not any(k.endswith(".location") for k in tasks)
    assert tasks["ssl.key.pem"] == (tmp_path / "client.key").read_text()
    assert tasks["ssl.ca.pem"].startswith("-----BEGIN CERTIFICATE-----")
    for config in (driver, tasks):  # librdkafka builds its TLS context from either form
        Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", **config}).close()
    with pytest.raises(KafkaException):
        Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", **tasks, "ssl.key.pem": "not a key"})

    assert for_executors({"ssl.ca.location": str(tmp_path)}) == {"ssl.ca.location": str(tmp_path)}
    assert for_executors({"ssl.ca.location": "probe"}) == {"ssl.ca.location": "probe"}
