#!/usr/bin/env bash
# Local stack: ZooKeeper, a Kafka-protocol broker (noida-db) and a Spark Connect server; on request also
# object stores for the lake: an S3 endpoint (moto_server, in memory) and Azure's emulator (Azurite).
#
#   scripts/stack.sh start|stop|status [zookeeper|kafka|spark|s3|azurite|cluster ...]   (default: the first three;
#                                     stop without names: every server of the state folder that is running)
#
# `cluster` is a Spark standalone cluster on this host: a master (spark-master), two workers of one core each
# (spark-worker-1, spark-worker-2; each with its own work, scratch and temporary folders and an environment of its
# own, not the caller's), and the Spark Connect server pointed at the master instead of local[2]. `start cluster`
# starts ZooKeeper and the broker too. The executors run the Python of .venv (spark.pyspark.python): an installed
# environment on every node, as a real cluster has. They get the lake's storage options from the tasks, as on any
# cluster, never from the driver's environment or disk.
#
# Environment (defaults in brackets):
#   EP_STATE_DIR [<repo>/.state]  EP_ZK_PORT [12181]  EP_KAFKA_PORT [19092]
#   EP_SPARK_CONNECT_PORT [15002]  SPARK_MASTER [local[2]]  EP_SPARK_DRIVER_MEMORY [4g]
#   EP_START_TIMEOUT [per server: 60 s, Spark 180 s]
#   EP_SPARK_UI_PORT [unset: no UI; cluster: 14040]: the Connect server's application UI and its REST API (task metrics)
#   EP_SPARK_MASTER_PORT [17077]  EP_SPARK_MASTER_UI_PORT [18080]  EP_SPARK_WORKER_UI_PORTS [18081 18082]
#   EP_SPARK_EXECUTOR_MEMORY [3g]: per executor (one per worker) in cluster mode  EP_SPARK_WORKER_MEMORY [4g]
#   EP_S3_PORT [19000]  EP_AZURITE_PORT [10000]  EP_LAKE_BUCKET [lake]: the bucket / container created on start
#   (S3 credentials test/test, region us-east-1; Azurite's well-known devstoreaccount1 key)
#
# Layout per server <name>: data $EP_STATE_DIR/<name>, log $EP_STATE_DIR/logs/<name>.log,
# pid $EP_STATE_DIR/pids/<name>.pid (the process that listens on the port) and
# $EP_STATE_DIR/pids/<name>.pgid (the session it was started in, swept on stop).
# `status` exits 0 only when every selected server is running and answering, else 3.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EP_STATE_DIR="${EP_STATE_DIR:-$REPO/.state}"
EP_ZK_PORT="${EP_ZK_PORT:-12181}"
EP_KAFKA_PORT="${EP_KAFKA_PORT:-19092}"
EP_SPARK_CONNECT_PORT="${EP_SPARK_CONNECT_PORT:-15002}"
EP_S3_PORT="${EP_S3_PORT:-19000}"
EP_AZURITE_PORT="${EP_AZURITE_PORT:-10000}"
EP_LAKE_BUCKET="${EP_LAKE_BUCKET:-lake}"
EP_SPARK_MASTER_PORT="${EP_SPARK_MASTER_PORT:-17077}"
EP_SPARK_MASTER_UI_PORT="${EP_SPARK_MASTER_UI_PORT:-18080}"
read -r -a WORKER_UI_PORTS <<<"${EP_SPARK_WORKER_UI_PORTS:-18081 18082}"
MASTER_URL="spark://127.0.0.1:$EP_SPARK_MASTER_PORT"
AZURITE_KEY="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="  # its public dev key
PY="$REPO/.venv/bin/python"
LOG_DIR="$EP_STATE_DIR/logs"
PID_DIR="$EP_STATE_DIR/pids"
STOP_TIMEOUT=30
ALL=(zookeeper kafka spark)
CLUSTER=(zookeeper kafka spark-master spark-worker-1 spark-worker-2 spark)
KNOWN=(zookeeper kafka spark-master spark-worker-1 spark-worker-2 spark s3 azurite)  # start order

die() { echo "stack: $*" >&2; exit 1; }
say() { echo "stack: $*"; }

port_of() {
    case "$1" in
        zookeeper) echo "$EP_ZK_PORT" ;;
        kafka) echo "$EP_KAFKA_PORT" ;;
        spark) echo "$EP_SPARK_CONNECT_PORT" ;;
        spark-master) echo "$EP_SPARK_MASTER_PORT" ;;
        spark-worker-*) echo "${WORKER_UI_PORTS[$((${1#spark-worker-} - 1))]}" ;;
        s3) echo "$EP_S3_PORT" ;;
        azurite) echo "$EP_AZURITE_PORT" ;;
    esac
}

# A string that must appear in the process command line; protects against PID reuse.
signature_of() {
    case "$1" in
        zookeeper) echo "QuorumPeerMain" ;;
        kafka) echo "noida-db" ;;
        spark) echo "SparkConnectServer" ;;
        spark-master) echo "deploy.master.Master" ;;
        spark-worker-*) echo "$EP_STATE_DIR/$1/work" ;;
        s3) echo "moto_server" ;;
        azurite) echo "azurite-blob" ;;
    esac
}

start_timeout_of() {
    case "$1" in
        spark) echo "${EP_START_TIMEOUT:-180}" ;;  # JVM + Spark session on 2 cores
        *) echo "${EP_START_TIMEOUT:-60}" ;;
    esac
}

pid_file() { echo "$PID_DIR/$1.pid"; }
pgid_file() { echo "$PID_DIR/$1.pgid"; }
read_file() { if [ -f "$1" ]; then tr -dc '0-9' <"$1"; fi; }

# Alive and really ours. Zombies have an empty cmdline, so they count as dead.
pid_matches() {
    local pid="$1" sig="$2"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
        && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$sig"
}

# Live processes of a session we created with setsid (session id == leader pid).
session_members() { [ -n "$1" ] && pgrep -s "$1" 2>/dev/null || true; }

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# PID of the process that has a LISTEN socket on 127.0.0.1:<port> (Spark shows as ::ffff:127.0.0.1).
listener_pid() {
    ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2 || true
}

zk_healthy() {
    local out
    # Four-letter word over plain TCP; the server answers "imok" and closes.
    out="$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$EP_ZK_PORT; printf ruok >&3; cat <&3" 2>/dev/null)" || true
    [ "$out" = "imok" ]
}

kafka_healthy() {
    port_open "$EP_KAFKA_PORT" || return 1
    # An open port is not enough: the broker must answer a metadata request.
    timeout 15 "$PY" - "$EP_KAFKA_PORT" >/dev/null 2>&1 <<'EOF'
import sys
from confluent_kafka.admin import AdminClient
AdminClient({"bootstrap.servers": f"127.0.0.1:{sys.argv[1]}"}).list_topics(timeout=5)
EOF
}

spark_healthy() { port_open "$EP_SPARK_CONNECT_PORT"; }

# The master's state (its JSON page): a worker is ready once the master lists it ALIVE.
worker_registered() {
    "$PY" - "$EP_SPARK_MASTER_UI_PORT" "$(port_of "$1")" <<'EOF'
import json, sys, urllib.request
state = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/json/", timeout=3))
sys.exit(0 if any(w["state"] == "ALIVE" and w["webuiaddress"].endswith(f":{sys.argv[2]}") for w in state["workers"]) else 1)
EOF
}

healthy() {
    case "$1" in
        zookeeper) zk_healthy ;;
        kafka) kafka_healthy ;;
        spark) spark_healthy ;;
        spark-master) port_open "$EP_SPARK_MASTER_PORT" && port_open "$EP_SPARK_MASTER_UI_PORT" ;;
        spark-worker-*) port_open "$(port_of "$1")" && worker_registered "$1" ;;
        s3) port_open "$EP_S3_PORT" ;;
        azurite) port_open "$EP_AZURITE_PORT" ;;
    esac
}

# --- per-server launch commands (fill CMD) ---

zookeeper_cmd() {
    local dir="$EP_STATE_DIR/zookeeper" jar cp=""
    mkdir -p "$dir/data"
    # Our own config so the Debian service config (/etc/zookeeper/conf/zoo.cfg) is never touched.
    cat >"$dir/zoo.cfg" <<EOF
tickTime=2000
initLimit=10
syncLimit=5
dataDir=$dir/data
clientPort=$EP_ZK_PORT
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,stat,srvr,mntr
EOF
    # zookeeper.jar's manifest Class-Path pulls in netty, jute, jackson, slf4j-api etc.
    for jar in zookeeper.jar zookeeper-jute.jar slf4j-api.jar slf4j-log4j12.jar log4j-1.2.jar \
               netty-buffer.jar netty-common.jar netty-handler.jar netty-transport.jar \
               netty-transport-native-epoll.jar netty-transport-native-unix-common.jar \
               netty-resolver.jar netty-codec.jar metrics-core.jar commons-cli.jar; do
        [ -f "/usr/share/java/$jar" ] || die "missing /usr/share/java/$jar (run scripts/install.sh)"
        cp="$cp:/usr/share/java/$jar"
    done
    # -Xmx: a dev ZooKeeper needs little; the JVM default would be 1/4 of RAM.
    # shellcheck disable=SC2054  # the comma belongs to the log4j logger value
    CMD=(java -Xmx512m -cp "/etc/zookeeper/conf$cp"
         -Dzookeeper.root.logger=INFO,CONSOLE
         -Dlog4j.configuration=file:/etc/zookeeper/conf/log4j.properties
         org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg")
}

kafka_cmd() {
    mkdir -p "$EP_STATE_DIR/kafka"
    [ -x "$REPO/.venv/bin/noida-db" ] || die "missing .venv/bin/noida-db (run scripts/install.sh)"
    # The wrapper spawns the real binary; we later record the binary (the listener) as the pid.
    CMD=("$REPO/.venv/bin/noida-db" start --data-dir "$EP_STATE_DIR/kafka" --only kafka
         --kafka-port "$EP_KAFKA_PORT" --host 127.0.0.1)
}

spark_cmd() {
    local spark_home
    mkdir -p "$EP_STATE_DIR/spark"
    spark_home="$(spark_home_of)"
    # Pin SPARK_HOME so an unrelated SPARK_HOME in the caller's env is not picked up.
    export SPARK_HOME="$spark_home" SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PY"
    # SPARK_REMOTE/SPARK_CONNECT_MODE are for clients: spark-submit refuses to start a server with them.
    unset SPARK_REMOTE SPARK_CONNECT_MODE_ENABLED SPARK_CONNECT_MODE
    # defaultSessionTimeout=-1: runs share one Connect session, which must never expire (spark/session.py).
    # executorEnv.TZ: a row plugin's naive datetime is read in the Python worker's local zone; UTC on every node.
    # Redaction: the data sources' options carry the storage and Kafka settings (a TLS key as its PEM text); the
    # UI and a plan's text show them redacted.
    # Our log configuration: no plan (it carries the tasks' storage options and erasure key) in the server's log.
    local master="${SPARK_MASTER:-local[2]}" ui=() on_cluster=()
    [ "$CLUSTER_MODE" = 1 ] && master="$MASTER_URL"
    if [[ "$master" == spark://* ]]; then
        # One executor per worker, each a core; the executors reach the driver on this host's loopback.
        on_cluster=(--conf spark.executor.cores=1 --conf "spark.executor.memory=${EP_SPARK_EXECUTOR_MEMORY:-3g}"
                    --conf spark.cores.max=2 --conf spark.driver.host=127.0.0.1 --conf spark.driver.bindAddress=127.0.0.1)
        EP_SPARK_UI_PORT="${EP_SPARK_UI_PORT:-14040}"
    fi
    if [ -n "${EP_SPARK_UI_PORT:-}" ]; then
        # The application UI's REST API gives every stage's task metrics (benchmarks, the cluster tier's tests).
        ui=(--conf spark.ui.enabled=true --conf "spark.ui.port=$EP_SPARK_UI_PORT" --conf spark.port.maxRetries=0)
    else
        ui=(--conf spark.ui.enabled=false)
    fi
    CMD=("$spark_home/bin/spark-submit"
         --class org.apache.spark.sql.connect.service.SparkConnectServer
         --driver-java-options "-Dlog4j2.configurationFile=file:$REPO/scripts/spark-log4j2.properties"
         --master "$master"
         --conf "spark.connect.grpc.binding.port=$EP_SPARK_CONNECT_PORT"
         --conf spark.connect.grpc.binding.address=127.0.0.1
         "${ui[@]}" "${on_cluster[@]}"
         --conf spark.connect.session.manager.defaultSessionTimeout=-1
         --conf spark.sql.shuffle.partitions=4
         --conf spark.sql.session.timeZone=UTC
         --conf spark.executorEnv.TZ=UTC
         --conf "spark.redaction.regex=(?i)secret|password|token|access[.]?key|pem"
         --conf "spark.sql.redaction.options.regex=(?i)url|kafka_config|storage_options"
         --conf "spark.driver.memory=${EP_SPARK_DRIVER_MEMORY:-4g}"
         --conf "spark.pyspark.python=$PY"
         --conf "spark.pyspark.driver.python=$PY"
         --name engagement-platform-connect
         spark-internal)
}

spark_home_of() {
    "$PY" -c 'import pyspark,os;print(os.path.dirname(pyspark.__file__))' \
        || die "pyspark not importable from .venv (run scripts/install.sh)"
}

spark-master_cmd() {
    local spark_home
    spark_home="$(spark_home_of)"
    CMD=(env -i "PATH=/usr/local/bin:/usr/bin:/bin" "HOME=$EP_STATE_DIR/spark-master" "SPARK_HOME=$spark_home"
         SPARK_LOCAL_IP=127.0.0.1 "SPARK_LOG_DIR=$LOG_DIR" ${JAVA_HOME:+"JAVA_HOME=$JAVA_HOME"}
         "$spark_home/bin/spark-class" org.apache.spark.deploy.master.Master
         --host 127.0.0.1 --port "$EP_SPARK_MASTER_PORT" --webui-port "$EP_SPARK_MASTER_UI_PORT")
}

# A worker shares nothing with the driver but the network: its own work folder (executors' current folders and
# logs), scratch folder (spark.local.dir) and temporary folder, a /tmp of its own where the host allows a mount
# namespace (root, or unprivileged user namespaces), and a fresh environment: nothing the caller or the platform's
# processes export (lake root, credentials, settings) reaches its executors.
spark_worker_cmd() {
    local name="$1" spark_home dir
    spark_home="$(spark_home_of)"
    dir="$EP_STATE_DIR/$name"
    mkdir -p "$dir/work" "$dir/scratch" "$dir/tmp"
    CMD=()
    if unshare --mount --propagation private true 2>/dev/null; then
        # And a /tmp of its own (a mount namespace with an empty tmpfs there): a file the driver side left in /tmp,
        # where the test suite's local lakes and temporary folders live, is not there for its executors.
        CMD=(unshare --mount --propagation private sh -c 'mount -t tmpfs -o size=2g tmpfs /tmp && exec "$@"' sh)
    fi
    CMD+=(env -i "PATH=/usr/local/bin:/usr/bin:/bin" "HOME=$dir" "TMPDIR=$dir/tmp" "SPARK_HOME=$spark_home"
         SPARK_LOCAL_IP=127.0.0.1 "SPARK_LOCAL_DIRS=$dir/scratch" "SPARK_LOG_DIR=$LOG_DIR"
         ${JAVA_HOME:+"JAVA_HOME=$JAVA_HOME"}
         "$spark_home/bin/spark-class" org.apache.spark.deploy.worker.Worker
         --host 127.0.0.1 --cores 1 --memory "${EP_SPARK_WORKER_MEMORY:-4g}" --work-dir "$dir/work"
         --webui-port "$(port_of "$name")" "$MASTER_URL")
}
spark-worker-1_cmd() { spark_worker_cmd spark-worker-1; }
spark-worker-2_cmd() { spark_worker_cmd spark-worker-2; }

s3_cmd() {
    [ -x "$REPO/.venv/bin/moto_server" ] || die "missing .venv/bin/moto_server (run scripts/install.sh)"
    CMD=("$REPO/.venv/bin/moto_server" -H 127.0.0.1 -p "$EP_S3_PORT")
}

azurite_cmd() {
    local bin
    bin="$(ls "$REPO"/.state/tools/azurite-*/node_modules/.bin/azurite-blob 2>/dev/null | head -n1)"
    [ -n "$bin" ] || die "missing Azurite (run scripts/install.sh)"
    CMD=("$bin" --blobHost 127.0.0.1 --blobPort "$EP_AZURITE_PORT" --location "$EP_STATE_DIR/azurite" --skipApiVersionCheck --loose)
}

# The lake's bucket / container, created once the store answers (an existing one is kept).
s3_ready() {
    "$PY" - "$EP_S3_PORT" "$EP_LAKE_BUCKET" <<'EOF'
import sys
import pyarrow.fs as pafs
pafs.S3FileSystem(access_key="test", secret_key="test", region="us-east-1", endpoint_override=f"127.0.0.1:{sys.argv[1]}",
                  scheme="http", allow_bucket_creation=True).create_dir(sys.argv[2])
EOF
}

azurite_ready() {
    "$PY" - "$EP_AZURITE_PORT" "$EP_LAKE_BUCKET" "$AZURITE_KEY" <<'EOF'
import sys
import pyarrow.fs as pafs
authority = f"127.0.0.1:{sys.argv[1]}"
pafs.AzureFileSystem(account_name="devstoreaccount1", account_key=sys.argv[3], blob_storage_authority=authority, blob_storage_scheme="http",
                     dfs_storage_authority=authority, dfs_storage_scheme="http").create_dir(sys.argv[2])
EOF
}

# --- lifecycle ---

# Kill a process by pid (TERM, wait, KILL), then sweep whatever is left in its session.
kill_server() {
    local name="$1" pid="$2" pgid="$3" sig i member
    sig="$(signature_of "$name")"
    if pid_matches "$pid" "$sig"; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < STOP_TIMEOUT * 5; i++)); do
            pid_matches "$pid" "$sig" || break
            sleep 0.2
        done
        if pid_matches "$pid" "$sig"; then
            say "$name: pid $pid still alive after ${STOP_TIMEOUT}s, sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    # Wrapper processes (python noida-db launcher, spark-submit) live in the same session.
    if [ -n "$(session_members "$pgid")" ]; then
        for member in $(session_members "$pgid"); do kill -TERM "$member" 2>/dev/null || true; done
        for ((i = 0; i < 25; i++)); do
            [ -n "$(session_members "$pgid")" ] || break
            sleep 0.2
        done
        for member in $(session_members "$pgid"); do kill -KILL "$member" 2>/dev/null || true; done
    fi
}

stop_one() {
    local name="$1" pid pgid lp
    pid="$(read_file "$(pid_file "$name")")"
    pgid="$(read_file "$(pgid_file "$name")")"
    if [ -z "$pid" ] && [ -z "$pgid" ]; then
        lp="$(listener_pid "$(port_of "$name")")"
        if [ -n "$lp" ]; then
            say "$name: no pid file; port $(port_of "$name") is held by pid $lp, not managed here, left alone"
        else
            say "$name: not running"
        fi
        return 0
    fi
    say "$name: stopping (pid ${pid:-?})"
    kill_server "$name" "$pid" "$pgid"
    rm -f "$(pid_file "$name")" "$(pgid_file "$name")"
    say "$name: stopped"
}

start_one() {
    local name="$1" port sig timeout pid pgid lp leader log deadline
    port="$(port_of "$name")"
    sig="$(signature_of "$name")"
    timeout="$(start_timeout_of "$name")"
    log="$LOG_DIR/$name.log"
    pid="$(read_file "$(pid_file "$name")")"

    if pid_matches "$pid" "$sig"; then
        if healthy "$name"; then
            say "$name: already running (pid $pid, 127.0.0.1:$port)"
            return 0
        fi
        say "$name: pid $pid alive but not answering yet, waiting"
        leader="$(read_file "$(pgid_file "$name")")"
    else
        if [ -n "$pid" ] || [ -f "$(pgid_file "$name")" ]; then
            # Stale files from a crash; also sweep any leftover wrapper processes.
            say "$name: removing stale pid file"
            kill_server "$name" "" "$(read_file "$(pgid_file "$name")")"
            rm -f "$(pid_file "$name")" "$(pgid_file "$name")"
        fi
        lp="$(listener_pid "$port")"
        if [ -n "$lp" ] || port_open "$port"; then
            die "$name: port 127.0.0.1:$port is already in use (pid ${lp:-unknown}); pick another port"
        fi
        CMD=()
        "${name}_cmd"
        mkdir -p "$EP_STATE_DIR/$name"
        printf '\n=== %s starting %s on 127.0.0.1:%s ===\n' "$(date -u '+%F %T')" "$name" "$port" >>"$log"
        # setsid: own session, so Ctrl-C in the caller's terminal or the caller exiting does not kill
        # the server; only `stop` does. fd 9 (the lock) is closed so servers don't hold it.
        # No job control here, so the subshell is not a group leader and setsid execs in place: $! is the leader.
        (cd "$EP_STATE_DIR/$name" && exec setsid "${CMD[@]}") >>"$log" 2>&1 </dev/null 9>&- &
        leader=$!
        echo "$leader" >"$(pid_file "$name")"
        echo "$leader" >"$(pgid_file "$name")"
        say "$name: started (session $leader), waiting for 127.0.0.1:$port"
    fi

    deadline=$((SECONDS + timeout))
    pid=""
    while ((SECONDS < deadline)); do
        lp="$(listener_pid "$port")"
        # Record the process that actually listens (java child / real noida-db binary), but only if it is ours.
        if [ -n "$lp" ] && [ "$(ps -o sid= -p "$lp" 2>/dev/null | tr -d ' ')" = "$leader" ]; then
            pid="$lp"
            echo "$pid" >"$(pid_file "$name")"
            if healthy "$name"; then
                if [ "$name" = s3 ] || [ "$name" = azurite ]; then
                    "${name}_ready" >>"$log" 2>&1 || { sleep 0.5; continue; }
                    say "$name: bucket $EP_LAKE_BUCKET ready"
                fi
                say "$name: healthy (pid $pid, 127.0.0.1:$port, log $log)"
                return 0
            fi
        elif [ -n "$lp" ]; then
            echo "stack: $name: port $port taken by foreign pid $lp" >&2
            break
        fi
        if [ -z "$(session_members "$leader")" ]; then
            echo "stack: $name: process exited during startup" >&2
            break
        fi
        sleep 0.5
    done
    ((SECONDS < deadline)) || echo "stack: $name: not healthy after ${timeout}s" >&2
    echo "----- last lines of $log -----" >&2
    tail -n 40 "$log" >&2 || true
    echo "------------------------------" >&2
    kill_server "$name" "$pid" "$leader"
    rm -f "$(pid_file "$name")" "$(pgid_file "$name")"
    exit 1
}

status_one() {
    local name="$1" port sig pid lp
    port="$(port_of "$name")"
    sig="$(signature_of "$name")"
    pid="$(read_file "$(pid_file "$name")")"
    if pid_matches "$pid" "$sig"; then
        if healthy "$name"; then
            printf '%-15s running   pid %-8s 127.0.0.1:%s\n' "$name" "$pid" "$port"
            return 0
        fi
        printf '%-15s unhealthy pid %-8s 127.0.0.1:%s not answering\n' "$name" "$pid" "$port"
        return 1
    fi
    lp="$(listener_pid "$port")"
    if [ -n "$lp" ]; then
        printf '%-15s stopped   (port %s held by pid %s, not managed here)\n' "$name" "$port" "$lp"
    elif [ -n "$pid" ]; then
        printf '%-15s stopped   (stale pid file, pid %s gone)\n' "$name" "$pid"
    else
        printf '%-15s stopped\n' "$name"
    fi
    return 1
}

usage() { echo "usage: $0 start|stop|status [zookeeper|kafka|spark|s3|azurite|cluster ...]" >&2; exit 2; }

[ $# -ge 1 ] || usage
ACTION="$1"
shift
SELECTED=()
CLUSTER_MODE=0  # the Connect server on the standalone master: `cluster` asked for, or this state folder's master runs
for n in "$@"; do
    case "$n" in
        cluster) SELECTED+=("${CLUSTER[@]}"); CLUSTER_MODE=1 ;;
        zookeeper | kafka | spark | spark-master | spark-worker-1 | spark-worker-2 | s3 | azurite) SELECTED+=("$n") ;;
        *) echo "stack: unknown server '$n'" >&2; usage ;;
    esac
done
if [ ${#SELECTED[@]} -eq 0 ]; then
    SELECTED=("${ALL[@]}")
    if [ "$ACTION" = stop ]; then  # and whatever else of this state folder runs (the cluster, the object stores)
        for n in "${KNOWN[@]}"; do if [ -f "$PID_DIR/$n.pid" ]; then SELECTED+=("$n"); fi; done
    fi
fi
if [ -z "${SPARK_MASTER:-}" ] && pid_matches "$(read_file "$PID_DIR/spark-master.pid")" deploy.master.Master; then
    CLUSTER_MODE=1
fi
# Canonical order regardless of argument order: ZooKeeper first on start, last on stop.
ORDERED=()
for n in "${KNOWN[@]}"; do
    for s in "${SELECTED[@]}"; do [ "$s" = "$n" ] && { ORDERED+=("$n"); break; }; done
done

case "$ACTION" in
    start | stop)
        [ -x "$PY" ] || die "no $PY; run scripts/install.sh first"
        mkdir -p "$EP_STATE_DIR" "$LOG_DIR" "$PID_DIR"
        # Serialise start/stop on one state dir (e.g. parallel test workers).
        exec 9>"$EP_STATE_DIR/.stack.lock"
        flock 9
        if [ "$ACTION" = start ]; then
            for n in "${ORDERED[@]}"; do start_one "$n"; done
        else
            for ((i = ${#ORDERED[@]} - 1; i >= 0; i--)); do stop_one "${ORDERED[$i]}"; done
        fi
        ;;
    status)
        rc=0
        for n in "${ORDERED[@]}"; do status_one "$n" || rc=3; done
        exit "$rc"
        ;;
    *) usage ;;
esac
