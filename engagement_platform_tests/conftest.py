"""The suite in tiers, the real local stack it runs against, and the run as a leak check.

Tiers. Every test carries markers that say what it needs and what it costs (declared in setup.cfg; assigned here
from the test's fixtures and helpers, or written on the test):
- `stack`: uses the local stack's servers (a fixture of support/stack.py SERVER_FIXTURES, directly or through
  another fixture); `unit`: every other test (none of the stack's servers; an object-store case may start one);
- `crash`: kills processes: calls support/crash.py's run_batch, killed_at or crash_then_rerun (in its body or
  through a helper of the suite), or is a host-crash case (test_host_crash.py marks its module);
- `objectstore`: uses an object-store server (the `s3_server` / `azurite_server` fixtures, or runs as the "s3"
  case of `lake_stores`; test_object_store.py as a whole);
- `soak`: minutes of the platform under faults (studies/test_soak_short.py);
- `matrix`: only in the full matrix (scripts/run_full_matrix.sh), not in the default tier
  (scripts/run_tests.sh: -m "not matrix"). Written on a slow test, or set here by the store rule: a crash test
  parametrized over `lake_stores` runs its "local" case in the default tier and every store in the matrix, except
  under test_object_store.py and lake/, whose object-store cases are the object-store coverage of the default tier.
- `on_cluster`: written on a test the cluster tier runs (scripts/run_cluster_tests.sh); it runs in the other tiers
  too. `cluster`: needs the cluster (test_cluster.py); only the cluster tier runs it. `driver_local_input`: its
  Spark tasks read input files from the driver's disk, which a cluster's executors do not share; the cluster tier
  leaves it out.

The cluster tier (EP_TEST_CLUSTER=1) starts the stack with a Spark standalone cluster of two one-core workers
instead of local[2], puts every lake on the S3 endpoint (a test parametrized over stores runs its object-store
case, and test_object_store.py its S3 cases) and deselects everything else: each batch's tasks run in executors
that share nothing with the driver but the lake's URL.

The stack (ZooKeeper, noida-db broker, Spark Connect server) starts once per run through the same scripts/stack.sh
the platform uses, on test ports and a test state folder. Object stores run once per run too, started by the first
test that needs one (support/object_store.py: moto_server, Azurite), with a fresh bucket per test.

A test marked `lake_stores("local", "s3")` runs once per store: its `lake_root`, `lake` and `checkpoints` (and the
environment the CLI's child processes read) point at a local folder or at a bucket of the S3 endpoint, so the
exactly-once crash tests hold on an object store too.

The run is also a leak check (support/secrets_scan.py): it runs with distinctive secret values and, at the end,
fails if any file it left behind (server logs, temporary folders, Dagster instances) holds one."""

from __future__ import annotations

import inspect
import os
import subprocess
import tempfile
import time
import types
import uuid
from pathlib import Path

import pytest

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.settings import load_settings
from engagement_platform.streams.kafka import KafkaClient
from engagement_platform_tests.support import crash
from engagement_platform_tests.support.object_store import OBJECT_STORE_FIXTURES, running_azurite, running_moto
from engagement_platform_tests.support.secrets_scan import RUN_SECRETS, files_holding
from engagement_platform_tests.support.stack import CLUSTER, PORTS, REPO, SERVER_FIXTURES, SERVERS, STACK_ENV, STATE

RUN_STARTED = time.time()
SHARED_STACK_ENV = "EP_TEST_STACK_SHARED"  # set by the controller of a spread run: its workers share its stack


def runs_workers(config) -> bool:
    """Whether this process is the controller of a run spread over worker processes (pytest-xdist's -n N)."""
    return not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") != "no"


def pytest_configure(config) -> None:
    os.environ.update(RUN_SECRETS)  # before any server or fixture starts: every process of the run inherits them
    if runs_workers(config):
        # The workers share one stack: the controller starts it before they start (they inherit its environment)
        # and stops it after they are gone; the workers' basetemps live under its basetemp, which the leak check
        # searches.
        config.option.basetemp = config.option.basetemp or tempfile.mkdtemp(prefix="engagement-platform-tests-")
        RUN_FOLDERS.extend([Path(config.option.basetemp), STATE])
        os.environ.update({**STACK_ENV, SHARED_STACK_ENV: "1"})
        _stack("start", *SERVERS)


def pytest_unconfigure(config) -> None:
    if runs_workers(config) and os.environ.get("EP_KEEP_STACK") != "1":
        _stack("stop")


RUN_FOLDERS: list = []  # the run's temporary folder (pytest's basetemp) and, once the stack started, its state folder


@pytest.fixture(scope="session", autouse=True)
def run_folder(tmp_path_factory):
    RUN_FOLDERS.append(tmp_path_factory.getbasetemp())


@pytest.hookimpl(trylast=True)  # after the session fixtures' teardown: the servers' shutdown logs are searched too
def pytest_sessionfinish(session, exitstatus) -> None:
    """Search every file the run left behind for the run's secrets; a hit fails the run."""
    if hasattr(session.config, "workerinput") or not session.testscollected:
        return
    # and the state folders of soaks the run started (their own stack, daemon and Dagster instance)
    roots = [*RUN_FOLDERS, *(p for p in (REPO / ".state").glob("soak-*") if p.stat().st_mtime >= RUN_STARTED)]
    hits, files, size = files_holding(RUN_SECRETS, roots)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    line = (
        f"secrets scan: {files} files, {size / 1e6:,.0f} MB searched for {len(RUN_SECRETS)} secrets, "
        f"{len(hits)} files hold one"
    )
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


TESTS = Path(__file__).resolve().parent
SUITE = TESTS.name  # the suite's package: calls into its modules are followed to the crash harness
CRASH_HELPERS = (crash.run_batch, crash.killed_at, crash.crash_then_rerun)  # each runs a batch a failpoint kills


def calls_crash_harness(function) -> bool:
    """Whether the test `function` names a CRASH_HELPERS function: in its body, in a function nested in it, or in a
    function of the suite (its module's helpers, support/) that it names, followed through such functions."""
    seen, todo = set(), [(function.__code__, function.__globals__)]
    while todo:
        code, names = todo.pop()
        if code in seen:
            continue
        seen.add(code)
        for name in code.co_names:
            value = names.get(name)
            if any(value is helper for helper in CRASH_HELPERS):
                return True
            module = getattr(value, "__module__", None) or ""
            if inspect.isfunction(value) and module.startswith(f"{SUITE}.") and module != crash.__name__:
                todo.append((value.__code__, value.__globals__))
        todo += [(const, names) for const in code.co_consts if isinstance(const, types.CodeType)]
    return False


def lake_store_of(item) -> str | None:
    """The `lake_stores` case the test runs as ("local", "s3"), or None when it is not parametrized over stores."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("lake_store") if callspec is not None else None


def in_cluster_tier(item) -> bool:
    """Whether the cluster tier runs the test: it needs the cluster, or is written `on_cluster` and runs its lake on
    the S3 endpoint (its "s3" case, if parametrized over stores: `lake_stores`, or test_object_store.py's `s3`)."""
    if item.get_closest_marker("cluster"):
        return True
    callspec = getattr(item, "callspec", None)
    store = (callspec.params.get("lake_store") or callspec.params.get("s3")) if callspec is not None else None
    wanted = item.get_closest_marker("on_cluster") is not None and not item.get_closest_marker("driver_local_input")
    return wanted and store in (None, "s3")


def keeps_its_store_cases(item) -> bool:
    """Object-store cases of these files stay in the default tier: they are its object-store coverage."""
    where = item.path.resolve().relative_to(TESTS).as_posix()
    return where == "test_object_store.py" or where.startswith("lake/")


def tiers_of(item) -> set[str]:
    """The markers the test gets from what it uses (the module docstring's rules), besides those written on it."""
    fixtures, store = set(getattr(item, "fixturenames", ())), lake_store_of(item)
    marks = {"stack" if SERVER_FIXTURES & fixtures or item.get_closest_marker("stack") else "unit"}
    if OBJECT_STORE_FIXTURES & fixtures or store not in (None, "local"):
        marks.add("objectstore")
    function = inspect.unwrap(getattr(item, "function", None))
    if item.get_closest_marker("crash") or (inspect.isfunction(function) and calls_crash_harness(function)):
        marks.add("crash")
        if store not in (None, "local") and not keeps_its_store_cases(item):
            marks.add("matrix")
    return {name for name in marks if item.get_closest_marker(name) is None}


@pytest.hookimpl(tryfirst=True)  # before pytest's own `-m` selection reads the markers
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        for name in sorted(tiers_of(item)):
            item.add_marker(name)
    if CLUSTER:
        left_out = [item for item in items if not in_cluster_tier(item)]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if in_cluster_tier(item)]
    # The longest tests first: in a run spread over workers (one file per worker at a time), the soak and the
    # host crashes start at once beside the rest instead of running alone at the end.
    items.sort(
        key=lambda item: 0 if item.get_closest_marker("soak") else 1 if item.path.name == "test_host_crash.py" else 2
    )


def _stack(action: str, *servers: str) -> None:
    env = {**os.environ, **PORTS, **STACK_ENV}
    subprocess.run(["bash", str(REPO / "scripts" / "stack.sh"), action, *servers], check=True, env=env)


@pytest.fixture(scope="session")
def stack():
    """Start the servers once; stop them at the end unless EP_KEEP_STACK=1 (faster local re-runs). A worker of a
    spread run uses the stack its controller started."""
    shared = os.environ.get(SHARED_STACK_ENV) == "1"
    os.environ.update(STACK_ENV)
    RUN_FOLDERS.append(STATE)  # its server logs are searched for the run's secrets at the end
    if not shared:
        _stack("start", *SERVERS)
    yield STACK_ENV
    from engagement_platform.spark.session import close_shared_clients

    close_shared_clients()  # Dagster resources' clients of the shared session: closed while the server is up
    if not shared and os.environ.get("EP_KEEP_STACK") != "1":
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
    """Where the test's lake lives: "local" unless the test is marked `lake_stores(...)`; in the cluster tier
    "s3"."""
    return getattr(request, "param", "s3" if CLUSTER else "local")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One S3 endpoint (moto_server) for the run, started by the first test that needs it; its log is in the run's
    temporary folder, which the leak check searches. A test takes a bucket of its own (`fresh_bucket`)."""
    with running_moto(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory):
    """One Azure storage emulator (Azurite) for the run, started by the first test that needs it; its data and log
    are in the run's temporary folder. A test takes a container of its own (`fresh_bucket`)."""
    with running_azurite(tmp_path_factory.mktemp("azurite")) as server:
        yield server


@pytest.fixture
def lake_root(request, tmp_path, monkeypatch, lake_store):
    # A fresh lake gets fresh coordination state: the job coordinator's znodes under its own root.
    monkeypatch.setenv("EP_ZK_ROOT", f"/tests/{uuid.uuid4().hex}")
    if lake_store == "local":
        root = str(tmp_path / "lake")
        monkeypatch.setenv("EP_LAKE_ROOT", root)
        yield root
        return
    assert lake_store == "s3", lake_store
    with request.getfixturevalue("s3_server").fresh_bucket() as options:  # the server only when a test needs it
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
