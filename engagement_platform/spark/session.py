"""Spark sessions: a Spark Connect client when SPARK_REMOTE is set, else a classic local session.

Runs launched by sensors are short-lived processes; a classic session would pay 5-12 s of JVM start
in each. A long-lived Spark Connect server (started with the stack) makes a run's session cost a gRPC
connection instead (BENCHMARKS.md). Data reaches Spark through Python data sources executed by the
server, never by shipping rows from the client (createDataFrame over Connect is slow).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.connect.client import DefaultChannelBuilder
from pyspark.sql.connect.client.retries import DefaultPolicy
from pyspark.sql.connect.session import SparkSession as ConnectSession

from engagement_platform.settings import load_settings
from engagement_platform.spark.kafka_source import KafkaOffsetsDataSource
from engagement_platform.spark.landing_source import LandingDocumentDataSource, LandingLinesDataSource

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


SESSION_MODE_ENV = "EP_SPARK_SESSION"  # shared (default) | per-run: which Spark Connect session a client joins
_CLOSED = "SESSION_CLOSED"

# How a Spark Connect client waits for a server that is away. pyspark's default retries a call for at least
# 10 minutes, with pauses growing to a minute, and gRPC's channel waits up to 2 minutes between reconnects: a
# run whose server restarts under it sits silent in one call for minutes (155 s measured), holding its run
# slot, until its ride-out can take a new client. Here a call gives up after ~15-20 s (the ride-out then tries
# the batch again on a new client, RIDE_OUT_S), and the client notices a server that is back within 2 s.
RECONNECT_BACKOFF_MS = 2_000
CALL_RETRIES: dict[str, Any] = {  # DefaultPolicy's arguments
    "max_retries": 12,
    "initial_backoff": 50,
    "backoff_multiplier": 2.0,
    "max_backoff": RECONNECT_BACKOFF_MS,
}
CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 500,
    "grpc.min_reconnect_backoff_ms": 500,
    "grpc.max_reconnect_backoff_ms": RECONNECT_BACKOFF_MS,
}


class SharedSessionClosed(RuntimeError):
    """The server closed the shared Spark Connect session; clients cannot join it again."""


def build_session(config: dict[str, str], shared: bool = True) -> SparkSession:
    """A configured session: a Spark Connect client when config has spark.remote (on the shared session
    unless `shared` is False or EP_SPARK_SESSION=per-run: callers that stop() their session pass False),
    else a classic session."""
    remote = config.get("spark.remote")
    if remote is None:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # PySpark turns any session into a Connect client while SPARK_REMOTE is set (even empty).
        os.environ.pop("SPARK_REMOTE", None)
    elif shared and _shares(remote):
        return connect_shared(remote)
    builder = SparkSession.builder if remote is None else connect_builder(remote)
    for key, value in config.items():
        if key != "spark.remote":  # the channel builder has it
            builder = builder.config(key, value)
    return _configured(builder.getOrCreate())


def connect_builder(remote: str) -> Any:
    """A Spark Connect session builder on `remote` (sc://...) whose channel reconnects within
    RECONNECT_BACKOFF_MS of the server coming back (CHANNEL_OPTIONS). Typed Any: its sessions are used as
    pyspark.sql.SparkSession, as those of pyspark's own builder.remote() are, though pyspark types them apart."""
    # What pyspark's own builder.remote() does: pyspark.sql.functions and others dispatch on this flag, and without it
    # build Column objects for a classic session (an AssertionError in F.col under a Connect session).
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    channel = DefaultChannelBuilder(remote)
    for key, value in CHANNEL_OPTIONS.items():
        channel.setChannelOption(key, value)
    return ConnectSession.builder.channelBuilder(channel)


def _configured(spark: SparkSession) -> SparkSession:
    """The session settings every run relies on (the first call is the client's first RPC). A Connect client
    whose server refused it or is away is closed before the error goes on: nobody holds it, and left open it
    kept its process from exiting."""
    remote = isinstance(spark, ConnectSession)
    if remote:
        spark.client.set_retry_policies([DefaultPolicy(**CALL_RETRIES)])
    try:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        # JSON allows a repeated key and parsers keep the last; Spark's default (EXCEPTION) would fail a
        # whole batch on one such record.
        spark.conf.set("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
        for source in (KafkaOffsetsDataSource, LandingLinesDataSource, LandingDocumentDataSource):
            register_data_source(spark, source)
    except Exception:  # pyspark's Connect errors do not share a narrower base class
        if remote:
            close_quietly(spark)
        raise
    return spark


def register_data_source(spark: SparkSession, source: type) -> None:
    """Register a Python data source (the framework's own at session start; a domain registers its own
    where it uses it). On the shared session a name registered before is replaced, but two
    runs registering it at the same moment make one fail with DATA_SOURCE_ALREADY_EXISTS (runs start together
    under run_platform.sh): the other run's registration of the same class stands."""
    try:
        spark.dataSource.register(source)
    except Exception as e:  # pyspark's Connect AnalysisException
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(e):
            raise


def _shares(remote: str) -> bool:
    mode = load_settings().spark_session_mode
    if mode not in ("shared", "per-run"):
        raise ValueError(f"{SESSION_MODE_ENV}={mode!r}: expected shared or per-run")
    return mode == "shared" and "session_id=" not in remote  # an id in SPARK_REMOTE is the operator's choice


_SHARED: dict[str, SparkSession] = {}  # remote -> this process's client of the shared session


def close_shared_clients() -> None:
    """Close this process's clients of shared sessions without ending the sessions. Call it before the
    server stops: a client still open when the server is gone kept the process alive at exit."""
    while _SHARED:
        _, spark = _SHARED.popitem()
        spark.client.close()


def discard_shared_client(spark: SparkSession) -> bool:
    """Forget and close `spark` if it is this process's client of a shared session (a server restarted under
    it: its channel and the server-side session it knew are gone), so the next build_session connects anew and
    configures the new server's session (settings, data sources). False for any other session (a per-run one
    is left to its owner: stopping it would ask a server that may be away to release it)."""
    remotes = [remote for remote, known in _SHARED.items() if known is spark]
    for remote in remotes:
        del _SHARED[remote]
    if remotes:
        close_quietly(spark)
    return bool(remotes)


def close_quietly(spark: SparkSession) -> None:
    """Close a client whose server refused or lost it, once: left to SparkSession.__del__ at interpreter exit,
    such a client's channel hung the process (pyspark 4.2, grpcio: it never exited)."""
    try:
        spark.client.close()
    except Exception:  # noqa: BLE001 - a client whose server is gone may fail to close; it is dropped either way
        pass
    vars(spark.client)["close"] = lambda: None  # shadows the method: a later close() (__del__'s) does nothing


def shared_session_id(remote: str) -> str:
    """The server-side session every client of `remote` joins (the same id in every process)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"engagement_platform:{remote}"))


def with_session_id(remote: str, session_id: str) -> str:
    """`remote` (sc://host:port[/;param=value...]) with a session_id parameter."""
    return f"{remote};session_id={session_id}" if "/;" in remote else f"{remote.rstrip('/')}/;session_id={session_id}"


def connect_shared(remote: str) -> SparkSession:
    """A Spark Connect client on the one server-side session all runs share.

    Why: Spark 4.2's Connect server keeps a Python worker factory, with its daemon processes (~48 MB
    each), per session until the server stops (SPARK-54055, fixed after 4.2). A sensor-launched run is
    a new process, so a session per run left ~3 daemons per run behind: 250 after 7 minutes of
    `run_platform.sh`, 12 GB. Runs sharing one session share its workers; every run sets the same
    session settings, and none stops it (a stopped or idle-expired session cannot be joined again:
    scripts/stack.sh starts the server with a session timeout of a year). EP_SPARK_SESSION=per-run, or
    a session_id in SPARK_REMOTE, opts out."""
    known = _SHARED.get(remote)
    if known is not None and not known.client.is_closed:
        return known  # one client per process, as getOrCreate gives
    session_id = shared_session_id(remote)
    spark = connect_builder(with_session_id(remote, session_id)).create()
    try:
        _SHARED[remote] = _configured(spark)
        return spark
    except (
        Exception
    ) as e:  # pyspark's Connect errors do not share a narrower base class (_configured closed the client)
        if _CLOSED not in str(e):
            raise
        raise SharedSessionClosed(
            f"the Spark Connect server closed the shared session {session_id} (its idle timeout, "
            f"spark.connect.session.manager.defaultSessionTimeout, passed, or a client stopped it). Restart the "
            f"server, raise that timeout, or set {SESSION_MODE_ENV}=per-run (one session per run: each leaves "
            f"Python worker daemons on a Spark 4.2 server)"
        ) from e
