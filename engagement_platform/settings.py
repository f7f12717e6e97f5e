"""Environment -> settings, read at run time (never at import time): the one place the platform reads
its environment variables, one section per stream.

Local defaults point at the servers `scripts/stack.sh` starts on 127.0.0.1; production sets the same
variables to real Kafka, ZooKeeper, object storage and a Spark Connect endpoint. Dagster resources take
the deployment-specific values through `EnvVar` (definitions.py), so the launchpad shows what a run uses;
`scripts/run_platform.sh` exports the local defaults for the processes it starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from engagement_platform.streams.cadence import Cadence, cadence_from

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class IngestionSettings:
    topic: str  # EP_ACTIVITIES_TOPIC


@dataclass(frozen=True)
class MutationSettings:
    topic: str  # EP_MUTATIONS_TOPIC
    pending_max_age_hours: float  # EP_MUTATION_PENDING_MAX_AGE_HOURS: how long a request may wait for its target


@dataclass(frozen=True)
class RetentionSettings:
    topic: str  # EP_GDPR_TOPIC
    interval_seconds: int  # EP_RETENTION_INTERVAL_SECONDS: cadence of retention batches
    vacuum_retention_hours: int  # EP_VACUUM_RETENTION_HOURS: how long removed files stay before vacuum


@dataclass(frozen=True)
class ErasureSettings:
    secret: bytes  # EP_ERASURE_SECRET: the key of the suppression list's hashes (a secret; never logged)
    secret_is_default: bool  # no EP_ERASURE_SECRET: the development key (fine on a laptop, never in production)
    window_seconds: float  # EP_ERASURE_WINDOW: an erased subject leaves every byte of the lake within this

    @property
    def handoff_age(self) -> timedelta:
        """Age after which the upkeep deletes a handoff folder: half the window, but never under an hour, so a
        short test window cannot delete the folder of a run still in flight."""
        return timedelta(seconds=max(self.retention_seconds, 3600))

    @property
    def retention_seconds(self) -> float:
        """Half the window: how long removed files and log entries stay. The upkeep runs at least once per
        half window (daily, by its schedule) and deletes what is older, so nothing outlives the window."""
        return self.window_seconds / 2


DEV_ERASURE_SECRET = "engagement-platform-development-only"
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'90s', '10m', '12h', '14d' (or plain seconds) -> seconds."""
    text = text.strip().lower()
    unit = DURATION_UNITS.get(text[-1:]) if text else None
    value = float(text[:-1] if unit else text)
    if value <= 0:
        raise ValueError(f"a duration must be positive, got {text!r}")
    return value * (unit or 1)


@dataclass(frozen=True)
class ProfileSettings:
    cdc_topic: str  # EP_PROFILE_CDC_TOPIC
    max_lag_seconds: float  # EP_PROFILE_MAX_LAG_SECONDS: replication lag above which the lag check fails
    erasure_topic: str  # EP_PROFILE_ERASURE_TOPIC: profile erasure requests
    staging_retention_seconds: float  # EP_PROFILE_STAGING_RETENTION: merged staging buckets older than this are deleted
    segments_dir: str  # EP_SEGMENTS_DIR: segment definitions, <dir>/all/*.yaml and <dir>/<tenant>/*.yaml


@dataclass(frozen=True)
class Settings:
    state_dir: str
    lake_root: str
    kafka_bootstrap_servers: str
    kafka_config: dict[str, str]  # librdkafka settings from KAFKA_CONFIG_* (kafka_config_from), for every Kafka client
    zookeeper_hosts: str
    zookeeper_root: str
    zookeeper_auth: str | None  # EP_ZK_AUTH "user:password": digest auth and ACLs on the coordinator's nodes (a secret)
    coordinator_enabled: bool
    max_predecessor_wait_seconds: float  # EP_MAX_PREDECESSOR_WAIT_SECONDS: bound of the coordinator's predecessor wait
    orphan_after_seconds: (
        float  # EP_ORPHAN_AFTER_SECONDS: a run with no liveness node this long after its last sign of life is failed
    )
    spark_remote: str
    spark_master: str
    spark_session_mode: str  # EP_SPARK_SESSION: shared | per-run
    max_records_per_partition: int  # EP_INGEST_MAX_RECORDS_PER_PARTITION: bounds every Kafka slice
    landing_root: str
    pipelines_dir: str
    ingestion: IngestionSettings
    mutation: MutationSettings
    retention: RetentionSettings
    profiles: ProfileSettings
    erasure: ErasureSettings
    storage_options: dict[str, str]  # for an object-store lake root: STORAGE_ENV's variables that are set
    batch_cadence_env: dict[str, str]  # EP_[<STREAM>_]BATCH_MIN_RECORDS / _MAX_WAIT_SECONDS (streams/cadence.py)

    def cadence(self, stream: str) -> Cadence:
        """When the stream's next Kafka batch is due: a minimum size and a maximum wait (default: every tick)."""
        return cadence_from(self.batch_cadence_env, stream)

    @property
    def lake_is_local(self) -> bool:
        return "://" not in self.lake_root


# Object-store settings passed to every delta-rs call and to the Spark tasks' pyarrow file systems (the
# executors do not share the driver's environment). Secrets among them never go into logs or metadata.
STORAGE_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ALLOW_HTTP",
    "AWS_CONDITIONAL_PUT",  # "etag": safe concurrent commits on S3 without a lock table
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_ENDPOINT",
    "AZURE_ALLOW_HTTP",
)


KAFKA_CONFIG_PREFIX = "KAFKA_CONFIG_"


def kafka_config_from(env: Mapping[str, str]) -> dict[str, str]:
    """librdkafka settings for every Kafka client of the platform (sensors, Spark tasks, CLI, demo producers):
    KAFKA_CONFIG_SECURITY_PROTOCOL=SASL_SSL -> {"security.protocol": "SASL_SSL"} (the rest of the name,
    lower case, "_" -> "."). Secrets (sasl.password, ssl key passwords) come the same way and are never logged."""
    return {
        name[len(KAFKA_CONFIG_PREFIX) :].lower().replace("_", "."): value
        for name, value in env.items()
        if name.startswith(KAFKA_CONFIG_PREFIX) and value
    }


def _flag(value: str) -> bool:
    return value.strip().lower() not in ("0", "off", "false", "no")


def erasure_settings(env: Mapping[str, str]) -> ErasureSettings:
    secret = env.get("EP_ERASURE_SECRET") or ""
    return ErasureSettings(
        secret=(secret or DEV_ERASURE_SECRET).encode(),
        secret_is_default=not secret,
        window_seconds=parse_duration(env.get("EP_ERASURE_WINDOW") or "14d"),
    )


def vacuum_hours(env: Mapping[str, str], erasure: ErasureSettings) -> int:
    """EP_VACUUM_RETENTION_HOURS, by default (and at most) half the erasure window, in whole hours."""
    limit = int(erasure.retention_seconds // 3600)
    if not env.get("EP_VACUUM_RETENTION_HOURS"):
        return limit
    hours = int(env["EP_VACUUM_RETENTION_HOURS"])
    if hours > limit:
        raise ValueError(
            f"EP_VACUUM_RETENTION_HOURS={hours} keeps removed files longer than half of EP_ERASURE_WINDOW "
            f"({erasure.window_seconds:g} s): erased rows would outlive the window; lower it or widen the window"
        )
    return hours


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    erasure = erasure_settings(env)
    state_dir = env.get("EP_STATE_DIR", str(REPO_ROOT / ".state"))
    return Settings(
        state_dir=state_dir,
        lake_root=env.get("EP_LAKE_ROOT") or str(Path(state_dir) / "lake"),
        kafka_bootstrap_servers=env.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"),
        kafka_config=kafka_config_from(env),
        zookeeper_hosts=env.get("ZOOKEEPER_HOSTS", "127.0.0.1:12181"),
        # Job coordinator znodes live under this path; a separate lake sharing the ensemble needs its own.
        zookeeper_root=env.get("EP_ZK_ROOT", "/engagement_platform"),
        zookeeper_auth=env.get("EP_ZK_AUTH") or None,
        coordinator_enabled=_flag(env.get("EP_COORDINATOR", "on")),
        # A last registered job that is not an allowed predecessor stops blocking a stream this long after
        # it registered (the allowed ones are idle then); "inf" keeps the order strictly, at liveness' cost.
        max_predecessor_wait_seconds=float(env.get("EP_MAX_PREDECESSOR_WAIT_SECONDS") or 120),
        # A STARTED run whose process is gone (no liveness node in ZooKeeper) is marked failed by its stream's
        # sensor once its start and its last event are this old: the time a batch stays stranded after a host crash.
        orphan_after_seconds=float(env.get("EP_ORPHAN_AFTER_SECONDS") or 60),
        # Empty SPARK_REMOTE means an in-process classic session on SPARK_MASTER.
        spark_remote=env.get("SPARK_REMOTE", "sc://127.0.0.1:15002"),
        spark_master=env.get("SPARK_MASTER", "local[2]"),
        spark_session_mode=env.get("EP_SPARK_SESSION", "shared").strip().lower(),
        max_records_per_partition=int(env.get("EP_INGEST_MAX_RECORDS_PER_PARTITION", "50000")),
        # Files land here (written elsewhere, then renamed in: a file is complete once it is visible).
        landing_root=env.get("EP_LANDING_ROOT") or str(Path(state_dir) / "landing"),
        pipelines_dir=env.get("EP_PIPELINES_DIR") or str(REPO_ROOT / "pipelines"),
        ingestion=IngestionSettings(topic=env.get("EP_ACTIVITIES_TOPIC", "engagement.activities")),
        mutation=MutationSettings(
            topic=env.get("EP_MUTATIONS_TOPIC", "engagement.mutations"),
            pending_max_age_hours=float(env.get("EP_MUTATION_PENDING_MAX_AGE_HOURS", "72")),
        ),
        retention=RetentionSettings(
            topic=env.get("EP_GDPR_TOPIC", "engagement.gdpr"),
            interval_seconds=int(env.get("EP_RETENTION_INTERVAL_SECONDS", "86400")),
            vacuum_retention_hours=vacuum_hours(env, erasure),
        ),
        profiles=ProfileSettings(
            cdc_topic=env.get("EP_PROFILE_CDC_TOPIC", "profile.cdc"),
            max_lag_seconds=float(env.get("EP_PROFILE_MAX_LAG_SECONDS", "900")),  # one staging bucket
            erasure_topic=env.get("EP_PROFILE_ERASURE_TOPIC", "profile.erasure"),
            staging_retention_seconds=parse_duration(env.get("EP_PROFILE_STAGING_RETENTION") or "7d"),
            segments_dir=env.get("EP_SEGMENTS_DIR") or str(REPO_ROOT / "segments"),
        ),
        erasure=erasure,
        storage_options={name: env[name] for name in STORAGE_ENV if env.get(name)},
        batch_cadence_env={
            name: value
            for name, value in env.items()
            if name.startswith("EP_") and name.endswith(("BATCH_MIN_RECORDS", "BATCH_MAX_WAIT_SECONDS"))
        },
    )
