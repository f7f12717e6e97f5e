"""The real local stack (ZooKeeper, noida-db broker, Spark Connect server), started once per test run
through the same scripts/stack.sh the platform uses, on test ports and a test state folder."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.streams.kafka import KafkaClient

REPO = Path(__file__).resolve().parent.parent
STATE = REPO / ".state" / "test"
PORTS = {"EP_ZK_PORT": "22181", "EP_KAFKA_PORT": "29092", "EP_SPARK_CONNECT_PORT": "25002"}
STACK_ENV = {
    "EP_STATE_DIR": str(STATE),
    "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{PORTS['EP_KAFKA_PORT']}",
    "ZOOKEEPER_HOSTS": f"127.0.0.1:{PORTS['EP_ZK_PORT']}",
    "SPARK_REMOTE": f"sc://127.0.0.1:{PORTS['EP_SPARK_CONNECT_PORT']}",
    "SPARK_LOCAL_IP": "127.0.0.1",
}


def _stack(action: str) -> None:
    env = {**os.environ, **PORTS, **STACK_ENV}
    subprocess.run(["bash", str(REPO / "scripts" / "stack.sh"), action], check=True, env=env)


@pytest.fixture(scope="session")
def stack():
    """Start the servers once; stop them at the end unless EP_KEEP_STACK=1 (faster local re-runs)."""
    os.environ.update(STACK_ENV)
    _stack("start")
    yield STACK_ENV
    from engagement_platform.spark.session import close_shared_clients

    close_shared_clients()  # Dagster resources' clients of the shared session: closed while the server is up
    if os.environ.get("EP_KEEP_STACK") != "1":
        _stack("stop")


@pytest.fixture(scope="session")
def spark(stack):
    from engagement_platform.spark.session import build_session

    session = build_session({"spark.remote": stack["SPARK_REMOTE"]}, shared=False)
    yield session
    session.stop()  # release the server-side session before the stack stops


@pytest.fixture(scope="session")
def kafka(stack) -> KafkaClient:
    return KafkaClient(stack["KAFKA_BOOTSTRAP_SERVERS"])


@pytest.fixture
def topic(kafka, monkeypatch) -> str:
    """A fresh 3-partition topic per test, also set as the platform's activities topic."""
    name = f"test.activities.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({name: 3})
    monkeypatch.setenv("EP_ACTIVITIES_TOPIC", name)
    return name


@pytest.fixture
def lake_root(tmp_path, monkeypatch) -> str:
    root = str(tmp_path / "lake")
    monkeypatch.setenv("EP_LAKE_ROOT", root)
    # A fresh lake gets fresh coordination state: the job coordinator's znodes under its own root.
    monkeypatch.setenv("EP_ZK_ROOT", f"/tests/{uuid.uuid4().hex}")
    return root


@pytest.fixture
def lake(lake_root) -> DeltaLake:
    return DeltaLake(lake_root)


@pytest.fixture
def checkpoints(lake) -> CheckpointStore:
    return CheckpointStore(lake)
