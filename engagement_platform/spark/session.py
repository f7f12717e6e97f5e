"""Spark sessions: a Spark Connect client when SPARK_REMOTE is set, else a classic local session.

Runs launched by sensors are short-lived processes; a classic session would pay 5-12 s of JVM start
in each. A long-lived Spark Connect server (started with the stack) makes a run's session cost a gRPC
connection instead (BENCHMARKS.md). Data reaches Spark through Python data sources executed by the
server, never by shipping rows from the client (createDataFrame over Connect is slow).
"""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

from engagement_platform.spark.kafka_source import KafkaOffsetsDataSource
from engagement_platform.spark.landing_source import LandingLinesDataSource
from engagement_platform.spark.profile_merge_source import ProfileMergeDataSource

# Settings for a 2-core machine; a cluster overrides them through its own spark-defaults.
LOCAL_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "4g",
}


def session_config(remote: str, master: str) -> dict[str, str]:
    """Spark Connect when `remote` is set, else a classic session on `master` tuned for 2 cores."""
    if remote:
        return {"spark.remote": remote}
    return {"spark.master": master, "spark.app.name": "engagement-platform", **LOCAL_CONF}


def build_session(config: dict[str, str]) -> SparkSession:
    if "spark.remote" not in config:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # PySpark turns any session into a Connect client while SPARK_REMOTE is set (even empty).
        os.environ.pop("SPARK_REMOTE", None)
    builder = SparkSession.builder
    for key, value in config.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    # JSON allows a repeated key and parsers keep the last; Spark's default (EXCEPTION) would fail a
    # whole batch on one such record.
    spark.conf.set("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
    spark.dataSource.register(KafkaOffsetsDataSource)
    spark.dataSource.register(LandingLinesDataSource)
    spark.dataSource.register(ProfileMergeDataSource)
    return spark
