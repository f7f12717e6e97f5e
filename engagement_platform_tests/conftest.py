"""The real local stack (ZooKeeper, noida-db broker, Spark Connect server), started once per test run
through the same scripts/stack.sh the platform uses, on test ports and a test state folder.

Every test that uses a server fixture (support/stack.py SERVER_FIXTURES, directly or through another
fixture) is marked `stack`: `pytest -m "not stack"` is the fast tier of pure logic, no server started.

The run is also a leak check (support/secrets_scan.py): it runs with distinctive secret values and, at the
end, fails if any file it left behind (server logs, temporary folders, Dagster instances) holds one.

A test marked `lake_stores("local", "s3")` runs once per store: its `lake_root`, `lake` and `checkpoints`
(and the environment the CLI's child processes read) point at a local folder or at a bucket of a local S3
endpoint (moto_server), so the exactly-once crash tests hold on an object store too."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.settings import load_settings
from engagement_platform.streams.kafka import KafkaClient
from engagement_platform_tests.support.object_store import s3_endpoint
from engagement_platform_tests.support.secrets_scan import RUN_SECRETS, files_holding
from engagement_platform_tests.support.stack import PORTS, REPO, SERVER_FIXTURES, STACK_ENV, STATE

RUN_STARTED = time.time()


def pytest_configure(config) -> None:
    os.environ.update(RUN_SECRETS)  # before any server or fixture starts: every process of the run inherits them


RUN_FOLDERS: list = []  # the run's temporary folder (pytest's basetemp) and, once the stack started, its state folder


@pytest.fixture(scope="session", autouse=True)
def run_folder(tmp_path_factory):
    RUN_FOLDERS.append(tmp_path_factory.getbasetemp())


@pytest.hookimpl(trylast=True)  # after the session fixtures' teardown: the servers' shutdown logs are searched too
def pytest_sessionfinish(session, exitstatus) -> None:
    """Search every file the run left behind for the run's secrets; a hit fails the run."""
    if getattr(session.config, "workerinput", None) is not None or not session.items:
        return
    # and the state folders of soaks the run started (their own stack, daemon and Dagster instance)
    roots = [*RUN_FOLDERS, *(p for p in (REPO / ".state").glob("soak-*") if p.stat().st_mtime >= RUN_STARTED)]
    hits, files, size = files_holding(RUN_SECRETS, roots)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    line = f"secrets scan: {files} files, {size / 1e6:,.0f} MB searched for {len(RUN_SECRETS)} secrets, {len(hits)} files hold one"
    if reporter is not None:
        reporter.write_line(line)
        for path, name in hits:
            reporter.write_line(f"  {name} found in {path}", red=True)
    if hits:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_generate_tests(metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("lake_stores")
    if marker is not None and "lake_root" in metafunc.fixturenames:
        metafunc.parametrize("lake_store", marker.args, indirect=True)


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.stack)


def _stack(action: str) -> None:
    env = {**os.environ, **PORTS, **STACK_ENV}
    subprocess.run(["bash", str(REPO / "scripts" / "stack.sh"), action], check=True, env=env)


@pytest.fixture(scope="session")
def stack():
    """Start the servers once; stop them at the end unless EP_KEEP_STACK=1 (faster local re-runs)."""
    os.environ.update(STACK_ENV)
    RUN_FOLDERS.append(STATE)  # its server logs are searched for the run's secrets at the end
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
def lake_store(request) -> str:
    """Where the test's lake lives: "local" unless the test is marked `lake_stores(...)`."""
    return getattr(request, "param", "local")


@pytest.fixture
def lake_root(tmp_path, monkeypatch, lake_store):
    # A fresh lake gets fresh coordination state: the job coordinator's znodes under its own root.
    monkeypatch.setenv("EP_ZK_ROOT", f"/tests/{uuid.uuid4().hex}")
    if lake_store == "local":
        root = str(tmp_path / "lake")
        monkeypatch.setenv("EP_LAKE_ROOT", root)
        yield root
        return
    assert lake_store == "s3", lake_store
    with s3_endpoint(tmp_path / "moto.log") as options:
        bucket = options.pop("bucket")
        for name, value in options.items():  # what a deployment sets: the CLI's child processes read it too
            monkeypatch.setenv(name, value)
        root = f"s3://{bucket}/lake"
        monkeypatch.setenv("EP_LAKE_ROOT", root)
        yield root


@pytest.fixture
def lake(lake_root, lake_store) -> DeltaLake:
    return DeltaLake(lake_root, load_settings().storage_options if lake_store != "local" else None)


@pytest.fixture
def checkpoints(lake) -> CheckpointStore:
    return CheckpointStore(lake)
