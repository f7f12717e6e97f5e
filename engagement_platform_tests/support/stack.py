"""Where the test stack runs: the repository (scripts/stack.sh, the script the platform itself uses),
the test state folder, the test ports and the environment the platform reads them from."""

from __future__ import annotations

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
SERVER_FIXTURES = frozenset({"stack", "own_zk"})  # fixtures that start servers: a test using one is marked `stack`
