"""Runs share one Spark Connect session (spark/session.py): on a Spark 4.2 server every session keeps its
own Python worker daemons until the server stops."""

import os
import subprocess
import sys

import pytest

from engagement_platform.spark.session import shared_session_id

RUN = """
import sys
from engagement_platform.spark.session import build_session
spark = build_session({"spark.remote": sys.argv[1]})
def same(batches):
    yield from batches
print(spark.client._session_id, spark.range(5).mapInArrow(same, "id long").count())
"""


def _daemons() -> set[int]:
    """PIDs of the machine's Python worker daemons. Compared as sets: other servers' daemons may exit meanwhile (the
    count falls when the short soak's server goes), which says nothing of ours."""
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return {int(line.split()[0]) for line in ps.splitlines()[1:] if "pyspark.daemon" in line}


def _run(remote: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", RUN, remote], capture_output=True, text=True, timeout=120, env=os.environ
    )


def test_runs_in_separate_processes_share_one_session_and_its_python_workers(stack):
    remote = stack["SPARK_REMOTE"] + "/;user_id=shared_session_test"
    first = _run(remote)
    assert first.returncode == 0, first.stderr[-2000:]
    after_first = _daemons()
    runs = [_run(remote) for _ in range(3)]
    assert all(r.returncode == 0 for r in runs), [r.stderr[-1000:] for r in runs]
    assert {r.stdout.split()[0] for r in [first, *runs]} == {shared_session_id(remote)}
    assert not _daemons() - after_first, "a run on the shared session started Python worker daemons of its own"


def test_a_closed_shared_session_fails_the_run_clearly_and_the_process_exits(stack):
    from engagement_platform.spark.session import build_session

    remote = stack["SPARK_REMOTE"] + "/;user_id=closed_session_test"
    build_session({"spark.remote": remote}).stop()  # the server now refuses this session id
    refused = _run(remote)
    assert refused.returncode == 1
    assert "SharedSessionClosed" in refused.stderr and "defaultSessionTimeout" in refused.stderr


AWAY = """
import sys, time
from engagement_platform.orchestration.runs import unavailable_service
from engagement_platform.spark.session import build_session
started = time.monotonic()
try:
    build_session({"spark.remote": sys.argv[1]}, shared=sys.argv[2] == "shared")
except Exception as e:
    print(unavailable_service(e), round(time.monotonic() - started, 1))
"""


@pytest.mark.stack  # waits out the clients' give-up on a server that is away: the stack tier, not the unit tier
def test_a_call_to_a_spark_server_that_is_away_gives_up_within_seconds_as_spark_unavailable():
    # pyspark's default retries a call for 10 minutes or more: a run sits silent in one call (155 s measured) after
    # its server restarts, and is taken for an orphan. Its ride-out can only try again once the call gives up.
    from engagement_platform_tests.support.object_store import free_port

    remote = f"sc://127.0.0.1:{free_port()}"  # nothing listens there
    for mode in ("shared", "per-run"):
        away = subprocess.run(
            [sys.executable, "-c", AWAY, remote, mode], capture_output=True, text=True, timeout=90, env=os.environ
        )
        assert away.returncode == 0, away.stderr[-2000:]
        service, seconds = away.stdout.split()
        assert service == "spark", away.stdout
        assert 3 < float(seconds) < 40, f"{mode}: gave up after {seconds} s (a dozen retries, at most 2 s apart)"


def test_a_session_built_in_a_fresh_process_takes_column_functions(stack):
    # pyspark.sql.functions dispatch on the Connect-mode flag that pyspark's builder.remote() sets; a client built
    # through a channel builder must set it too (without it F.col failed with an AssertionError in every run).
    code = (
        "import sys; from pyspark.sql import functions as F; from engagement_platform.spark.session import build_session; "
        "spark = build_session({'spark.remote': sys.argv[1]}, shared=sys.argv[2] == 'shared'); "
        "print(spark.range(3).select((F.col('id') + 1).alias('n')).agg(F.sum('n')).collect()[0][0])"
    )
    for mode in ("shared", "per-run"):
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
        done = subprocess.run(
            [sys.executable, "-c", code, stack["SPARK_REMOTE"] + "/;user_id=column_test", mode],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert done.returncode == 0 and done.stdout.split()[-1] == "6", done.stderr[-2000:]
