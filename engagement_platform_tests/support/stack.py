"""Where the test stack runs: the repository (scripts/stack.sh, the script the platform itself uses),
the test state folder, the test ports and the environment the platform reads them from."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATE = REPO / ".state" / "test"
PORTS = {"EP_ZK_PORT": "22181", "EP_KAFKA_PORT": "29092", "EP_SPARK_CONNECT_PORT": "25002"}
STACK_ENV = {
    "EP_STATE_DIR": str(STATE),
    "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{PORTS['EP_KAFKA_PORT']}",
    "ZOOKEEPER_HOSTS": f"127.0.0.1:{PORTS['EP_ZK_PORT']}",
    "SPARK_REMOTE": f"sc://127.0.0.1:{PORTS['EP_SPARK_CONNECT_PORT']}",
    "SPARK_LOCAL_IP": "127.0.0.1",
}
# The cluster tier (scripts/run_cluster_tests.sh): the stack's Spark is a standalone cluster of two one-core workers
# (scripts/stack.sh start cluster) and a test's lake is on the S3 endpoint unless it asks for another store.
CLUSTER = os.environ.get("EP_TEST_CLUSTER") == "1"
SERVERS = ("cluster",) if CLUSTER else ()  # what `stack.sh start` starts: the default servers, or the cluster
if CLUSTER:
    PORTS.update(
        {
            "EP_SPARK_MASTER_PORT": "27077",
            "EP_SPARK_MASTER_UI_PORT": "28080",
            "EP_SPARK_WORKER_UI_PORTS": "28081 28082",
            "EP_SPARK_UI_PORT": "24040",  # the Connect application's UI: its REST API shows where tasks ran
        }
    )
SERVER_FIXTURES = frozenset({"stack", "own_zk"})  # fixtures that start servers: a test using one is marked `stack`
