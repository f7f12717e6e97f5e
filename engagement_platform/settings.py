"""Environment -> settings, read at run time (never at import time), one section per stream.

The one place the platform reads its environment variables. Every variable is declared once in SETTINGS
(name, default, meaning, section): load_settings reads its defaults from there, and
docs/reference/configuration.md is generated from it (scripts/architecture.py), so the reference and the
code cannot disagree. Local defaults point at the servers `scripts/stack.sh` starts on 127.0.0.1;
production sets the same variables to real Kafka, ZooKeeper, object storage and a Spark Connect endpoint.
Any entry point works with every defaulted variable unset: the Dagster resources (resources.py) read these
settings when a run or a tick uses them, not when the code is loaded.

Long by design: SETTINGS is a declaration, one record per variable, and reads best as one list.
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
class Setting:
    """One environment variable the platform reads. `default` None: none (unset means off, or a secret the
    deployment must give); "{repo}" and "{EP_STATE_DIR}" in it stand for the repository and the state folder.
    A name with "<...>" is a family of variables (KAFKA_CONFIG_<NAME>)."""

    name: str
    default: str | None
    help: str
    section: str
    keep_empty: bool = False  # an empty value is a value of its own (SPARK_REMOTE), not "use the default"


SETTINGS: tuple[Setting, ...] = (
    # storage: where the platform keeps its state, its lake and its inputs
    Setting("EP_STATE_DIR", "{repo}/.state", "Local state: the lake and landing folders by default, logs.", "storage"),
    Setting("EP_LAKE_ROOT", "{EP_STATE_DIR}/lake", "The Delta lake root: a folder or an s3:// / az:// URI.", "storage"),
    Setting(
        "EP_LANDING_ROOT",
        "{EP_STATE_DIR}/landing",
        "Where landing files arrive (written elsewhere, then renamed in: a visible file is complete).",
        "storage",
    ),
    Setting(
        "EP_PIPELINES_DIR", "{repo}/pipelines", "Ingest pipeline definitions, one YAML file per pipeline.", "storage"
    ),
    # kafka: the cluster every Kafka stream reads, and how much a batch takes
    Setting("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092", "Kafka bootstrap servers of every client.", "kafka"),
    Setting(
        "KAFKA_CONFIG_<NAME>",
        None,
        "A librdkafka setting for every Kafka client: `KAFKA_CONFIG_SECURITY_PROTOCOL=SASL_SSL` sets "
        "`security.protocol` (the rest of the name, lower case, `_` as `.`). Secrets come the same way; never logged.",
        "kafka",
    ),
    Setting(
        "EP_INGEST_MAX_RECORDS_PER_PARTITION", "50000", "The most records one batch takes from a partition.", "kafka"
    ),
    Setting(
        "EP_BATCH_MIN_RECORDS",
        "1",
        "A Kafka stream plans a batch once this many records wait (streams/cadence.py); run_platform.sh sets 20000.",
        "kafka",
    ),
    Setting(
        "EP_BATCH_MAX_WAIT_SECONDS",
        "0",
        "...or once this long has passed since its previous batch (0: every tick); run_platform.sh sets 60.",
        "kafka",
    ),
    Setting(
        "EP_<STREAM>_BATCH_MIN_RECORDS",
        None,
        "EP_BATCH_MIN_RECORDS for one stream (`EP_MUTATION_BATCH_MIN_RECORDS`); unset: the shared value.",
        "kafka",
    ),
    Setting(
        "EP_<STREAM>_BATCH_MAX_WAIT_SECONDS",
        None,
        "EP_BATCH_MAX_WAIT_SECONDS for one stream; unset: the shared value.",
        "kafka",
    ),
    # coordinator: the ZooKeeper job coordinator
    Setting("ZOOKEEPER_HOSTS", "127.0.0.1:12181", "The ZooKeeper ensemble of the job coordinator.", "coordinator"),
    Setting(
        "EP_ZK_ROOT",
        "/engagement_platform",
        "The coordinator's znodes live under this path; another lake on the same ensemble needs its own.",
        "coordinator",
    ),
    Setting(
        "EP_ZK_AUTH",
        None,
        "user:password for digest auth and ACLs on the coordinator's znodes (a secret); unset: open znodes.",
        "coordinator",
    ),
    Setting(
        "EP_COORDINATOR",
        "on",
        "off (0, false, no) runs every stream without locks: a single writer only.",
        "coordinator",
    ),
    Setting(
        "EP_MAX_PREDECESSOR_WAIT_SECONDS",
        "120",
        "A last registered job that is not an allowed predecessor stops blocking a stream this long after it "
        "registered; inf keeps the order strictly, at liveness' cost.",
        "coordinator",
    ),
    Setting(
        "EP_ORPHAN_AFTER_SECONDS",
        "60",
        "A started run with no liveness node in ZooKeeper is failed by its stream's sensor once its start and its "
        "last event are this old: how long a batch stays stranded after a host crash.",
        "coordinator",
    ),
    # spark
    Setting(
        "SPARK_REMOTE",
        "sc://127.0.0.1:15002",
        "The Spark Connect endpoint; empty: an in-process classic session on SPARK_MASTER.",
        "spark",
        keep_empty=True,
    ),
    Setting("SPARK_MASTER", "local[2]", "The master of a classic session (SPARK_REMOTE empty).", "spark"),
    Setting(
        "EP_SPARK_SESSION",
        "shared",
        "shared: every run joins one Spark Connect session on the server; per-run: each run opens its own.",
        "spark",
    ),
    # one section per stream
    Setting("EP_ACTIVITIES_TOPIC", "engagement.activities", "Engagement activities.", "ingestion"),
    Setting("EP_MUTATIONS_TOPIC", "engagement.mutations", "ID mutation requests.", "mutation"),
    Setting(
        "EP_MUTATION_PENDING_MAX_AGE_HOURS",
        "72",
        "How long a mutation request waits for its missing targets before it expires to quarantine.",
        "mutation",
    ),
    Setting("EP_GDPR_TOPIC", "engagement.gdpr", "Retention and erasure requests of the engagement lake.", "retention"),
    Setting("EP_RETENTION_INTERVAL_SECONDS", "86400", "The cadence of retention batches.", "retention"),
    Setting(
        "EP_VACUUM_RETENTION_HOURS",
        None,
        "How long removed files stay before vacuum; unset: half of EP_ERASURE_WINDOW, which is also its upper bound.",
        "retention",
    ),
    Setting(
        "EP_ERASURE_SECRET",
        None,
        "The key of the suppression lists' hashes (a secret; never logged). Unset: a development-only key, "
        "fine on a laptop, never in production.",
        "erasure",
    ),
    Setting(
        "EP_ERASURE_WINDOW",
        "14d",
        "An erased subject leaves every byte of the lake within this (90s, 10m, 12h, 14d).",
        "erasure",
    ),
    Setting("EP_PROFILE_CDC_TOPIC", "profile.cdc", "Profile change records.", "profiles"),
    Setting("EP_PROFILE_ERASURE_TOPIC", "profile.erasure", "Profile erasure requests.", "profiles"),
    Setting(
        "EP_PROFILE_MAX_LAG_SECONDS",
        "900",
        "Replication lag above which the lag check fails (one staging bucket).",
        "profiles",
    ),
    Setting("EP_PROFILE_STAGING_RETENTION", "7d", "Merged staging buckets older than this are deleted.", "profiles"),
    Setting(
        "EP_PROFILE_TENANTS_PER_RUN",
        "100",
        "Most tenants one processor run merges: the sensor groups tenants with staged changes, consecutive in "
        "partition order, into runs of up to this many (1: a run per tenant).",
        "profiles",
    ),
    Setting(
        "EP_SEGMENTS_DIR",
        "{repo}/segments",
        "Segment definitions: `<dir>/all/*.yaml` for every tenant, `<dir>/<tenant>/*.yaml` for one.",
        "profiles",
    ),
    Setting(
        "EP_SEGMENTS_COMPACT_LOG_ROWS",
        "100000",
        "A tenant's segment change log is folded into its membership base once this many rows wait after the "
        "base's compaction point (and once a day whatever the count).",
        "profiles",
    ),
    # object store: passed to every delta-rs call and to the Spark tasks' file systems (the executors do not
    # share the driver's environment); secrets among them never go into logs or metadata
    Setting("AWS_ENDPOINT_URL", None, "S3: the endpoint (another S3-compatible store).", "object store"),
    Setting("AWS_REGION", None, "S3: the region.", "object store"),
    Setting("AWS_ACCESS_KEY_ID", None, "S3: the access key id.", "object store"),
    Setting("AWS_SECRET_ACCESS_KEY", None, "S3: the secret key (a secret).", "object store"),
    Setting("AWS_SESSION_TOKEN", None, "S3: a session token (a secret).", "object store"),
    Setting("AWS_ALLOW_HTTP", None, "S3: true allows a plain-HTTP endpoint.", "object store"),
    Setting(
        "AWS_CONDITIONAL_PUT",
        None,
        "S3: etag makes concurrent commits safe without a lock table.",
        "object store",
    ),
    Setting("AZURE_STORAGE_ACCOUNT_NAME", None, "ADLS / Azure Blob: the account.", "object store"),
    Setting("AZURE_STORAGE_ACCOUNT_KEY", None, "ADLS / Azure Blob: the account key (a secret).", "object store"),
    Setting("AZURE_ENDPOINT", None, "ADLS / Azure Blob: the endpoint (an emulator).", "object store"),
    Setting("AZURE_ALLOW_HTTP", None, "ADLS / Azure Blob: true allows a plain-HTTP endpoint.", "object store"),
    # testing hooks: read by streams/batch.py, unset in operation
    Setting("EP_FAILPOINT", None, "Crash tests: the batch step at which the process exits.", "testing hooks"),
    Setting("EP_PAUSEPOINT", None, "Crash tests: the batch step at which the process waits.", "testing hooks"),
    Setting(
        "EP_PAUSEPOINT_MARKER",
        None,
        "Crash tests: the file that says a process reached its pause point.",
        "testing hooks",
    ),
)
DECLARED = {setting.name: setting for setting in SETTINGS}


def setting_value(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value, else its declared default (None: neither). Empty counts as unset unless the
    setting keeps empty values."""
    setting = DECLARED[name]
    value = env.get(name)
    if value is not None and (value or setting.keep_empty):
        return value
    if setting.default is None:
        return None
    state_dir = setting_value(env, "EP_STATE_DIR") if "{EP_STATE_DIR}" in setting.default else ""
    return setting.default.format(repo=REPO_ROOT, EP_STATE_DIR=state_dir)


def required(env: Mapping[str, str], name: str) -> str:
    """A setting that has a default: its value."""
    value = setting_value(env, name)
    if value is None:
        raise LookupError(f"{name} is declared without a default")
    return value


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
    segments_compact_log_rows: int  # EP_SEGMENTS_COMPACT_LOG_ROWS: log rows past the base that trigger a compaction
    tenants_per_run: int  # EP_PROFILE_TENANTS_PER_RUN: most tenants one processor run merges


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


# Object-store settings passed to every delta-rs call and to the Spark tasks' pyarrow file systems.
STORAGE_ENV = tuple(setting.name for setting in SETTINGS if setting.section == "object store")


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
    secret = setting_value(env, "EP_ERASURE_SECRET")
    return ErasureSettings(
        secret=(secret or DEV_ERASURE_SECRET).encode(),
        secret_is_default=not secret,
        window_seconds=parse_duration(required(env, "EP_ERASURE_WINDOW")),
    )


def vacuum_hours(env: Mapping[str, str], erasure: ErasureSettings) -> int:
    """EP_VACUUM_RETENTION_HOURS, by default (and at most) half the erasure window, in whole hours."""
    limit = int(erasure.retention_seconds // 3600)
    given = setting_value(env, "EP_VACUUM_RETENTION_HOURS")
    if given is None:
        return limit
    hours = int(given)
    if hours > limit:
        raise ValueError(
            f"EP_VACUUM_RETENTION_HOURS={hours} keeps removed files longer than half of EP_ERASURE_WINDOW "
            f"({erasure.window_seconds:g} s): erased rows would outlive the window; lower it or widen the window"
        )
    return hours


def absolute_location(location: str) -> str:
    """A local folder as an absolute path (a URI as given): Spark tasks resolve a relative path in their own
    working directory, which on a cluster is a worker's folder, not the driver's."""
    return location if "://" in location else os.path.abspath(location)


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    erasure = erasure_settings(env)

    def get(name: str) -> str:
        return required(env, name)

    return Settings(
        state_dir=get("EP_STATE_DIR"),
        lake_root=absolute_location(get("EP_LAKE_ROOT")),
        kafka_bootstrap_servers=get("KAFKA_BOOTSTRAP_SERVERS"),
        kafka_config=kafka_config_from(env),
        zookeeper_hosts=get("ZOOKEEPER_HOSTS"),
        zookeeper_root=get("EP_ZK_ROOT"),
        zookeeper_auth=setting_value(env, "EP_ZK_AUTH"),
        coordinator_enabled=_flag(get("EP_COORDINATOR")),
        max_predecessor_wait_seconds=float(get("EP_MAX_PREDECESSOR_WAIT_SECONDS")),
        orphan_after_seconds=float(get("EP_ORPHAN_AFTER_SECONDS")),
        spark_remote=get("SPARK_REMOTE"),
        spark_master=get("SPARK_MASTER"),
        spark_session_mode=get("EP_SPARK_SESSION").strip().lower(),
        max_records_per_partition=int(get("EP_INGEST_MAX_RECORDS_PER_PARTITION")),
        landing_root=get("EP_LANDING_ROOT"),
        pipelines_dir=get("EP_PIPELINES_DIR"),
        ingestion=IngestionSettings(topic=get("EP_ACTIVITIES_TOPIC")),
        mutation=MutationSettings(
            topic=get("EP_MUTATIONS_TOPIC"),
            pending_max_age_hours=float(get("EP_MUTATION_PENDING_MAX_AGE_HOURS")),
        ),
        retention=RetentionSettings(
            topic=get("EP_GDPR_TOPIC"),
            interval_seconds=int(get("EP_RETENTION_INTERVAL_SECONDS")),
            vacuum_retention_hours=vacuum_hours(env, erasure),
        ),
        profiles=ProfileSettings(
            cdc_topic=get("EP_PROFILE_CDC_TOPIC"),
            max_lag_seconds=float(get("EP_PROFILE_MAX_LAG_SECONDS")),
            erasure_topic=get("EP_PROFILE_ERASURE_TOPIC"),
            staging_retention_seconds=parse_duration(get("EP_PROFILE_STAGING_RETENTION")),
            segments_dir=get("EP_SEGMENTS_DIR"),
            segments_compact_log_rows=int(get("EP_SEGMENTS_COMPACT_LOG_ROWS")),
            tenants_per_run=max(int(get("EP_PROFILE_TENANTS_PER_RUN")), 1),
        ),
        erasure=erasure,
        storage_options={name: env[name] for name in STORAGE_ENV if env.get(name)},
        batch_cadence_env={
            name: value
            for name, value in env.items()
            if name.startswith("EP_") and name.endswith(("BATCH_MIN_RECORDS", "BATCH_MAX_WAIT_SECONDS"))
        },
    )
