"""Environment -> settings, read at run time (never at import time).

Local defaults point at the servers `scripts/stack.sh` starts on 127.0.0.1; production sets the same
variables to real Kafka, ZooKeeper, object storage and a Spark Connect endpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Settings:
    state_dir: str
    lake_root: str
    kafka_bootstrap_servers: str
    zookeeper_hosts: str
    zookeeper_root: str
    coordinator_enabled: bool
    spark_remote: str
    spark_master: str
    ingest_max_records_per_partition: int
    activities_topic: str
    landing_root: str
    pipelines_dir: str

    @property
    def lake_is_local(self) -> bool:
        return "://" not in self.lake_root


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    state_dir = env.get("EP_STATE_DIR", str(REPO_ROOT / ".state"))
    return Settings(
        state_dir=state_dir,
        lake_root=env.get("EP_LAKE_ROOT", str(Path(state_dir) / "lake")),
        kafka_bootstrap_servers=env.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"),
        zookeeper_hosts=env.get("ZOOKEEPER_HOSTS", "127.0.0.1:12181"),
        # Job coordinator znodes live under this path; a separate lake sharing the ensemble needs its own.
        zookeeper_root=env.get("EP_ZK_ROOT", "/engagement_platform"),
        coordinator_enabled=env.get("EP_COORDINATOR", "on").strip().lower() not in ("0", "off", "false", "no"),
        # Empty SPARK_REMOTE means an in-process classic session on SPARK_MASTER.
        spark_remote=env.get("SPARK_REMOTE", "sc://127.0.0.1:15002"),
        spark_master=env.get("SPARK_MASTER", "local[2]"),
        ingest_max_records_per_partition=int(env.get("EP_INGEST_MAX_RECORDS_PER_PARTITION", "50000")),
        activities_topic=env.get("EP_ACTIVITIES_TOPIC", "engagement.activities"),
        # Files land here (written elsewhere, then renamed in: a file is complete once it is visible).
        landing_root=env.get("EP_LANDING_ROOT", str(Path(state_dir) / "landing")),
        pipelines_dir=env.get("EP_PIPELINES_DIR", str(REPO_ROOT / "pipelines")),
    )
