#!/usr/bin/env bash
# Run the whole platform locally: stack (ZooKeeper, broker, Spark Connect), topics,
# a demo producer and `dagster dev`. Ctrl-C (or SIGTERM) stops everything it started.
#
# Environment: EP_STATE_DIR [<repo>/.state], EP_DAGSTER_PORT [3000], plus the
# port variables of scripts/stack.sh. EP_DEMO_STORE=s3 (or azure) puts the lake and the landing
# files on a local S3 endpoint (Azure's emulator) that stack.sh starts; the default is a local folder.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

bash scripts/install.sh

# Exported so stack.sh, the CLI and Dagster all agree on where local state lives.
export EP_STATE_DIR="${EP_STATE_DIR:-$REPO/.state}"
# One Dagster instance per lake: sensor cursors and run history belong to the lake they planned in.
case "${EP_DEMO_STORE:-local}" in
    local) export DAGSTER_HOME="$EP_STATE_DIR/dagster_home" ;;
    # moto keeps its objects in memory: each start is a fresh lake, so a fresh instance too.
    s3) export DAGSTER_HOME="$EP_STATE_DIR/dagster_home-s3"; rm -rf "$DAGSTER_HOME" ;;
    *) export DAGSTER_HOME="$EP_STATE_DIR/dagster_home-${EP_DEMO_STORE}" ;;
esac
DAGSTER_PORT="${EP_DAGSTER_PORT:-3000}"
LOG_DIR="$EP_STATE_DIR/logs"
PID_DIR="$EP_STATE_DIR/pids"
mkdir -p "$DAGSTER_HOME" "$LOG_DIR" "$PID_DIR"
if [ -f "$REPO/dagster.yaml" ]; then cp "$REPO/dagster.yaml" "$DAGSTER_HOME/dagster.yaml"; fi
# The instance's storage is created (or migrated after a Dagster upgrade) once, before `dagster dev` starts its
# processes: on a fresh DAGSTER_HOME they would create it at the same moment, and one can find it half stamped.
.venv/bin/dagster instance migrate >/dev/null
# The platform's settings (engagement_platform/settings.py) follow the local stack's ports unless
# the caller points them elsewhere.
export KAFKA_BOOTSTRAP_SERVERS="${KAFKA_BOOTSTRAP_SERVERS:-127.0.0.1:${EP_KAFKA_PORT:-19092}}"
export ZOOKEEPER_HOSTS="${ZOOKEEPER_HOSTS:-127.0.0.1:${EP_ZK_PORT:-12181}}"
export SPARK_REMOTE="${SPARK_REMOTE-sc://127.0.0.1:${EP_SPARK_CONNECT_PORT:-15002}}"
STORES=()
case "${EP_DEMO_STORE:-local}" in
    local) export EP_LAKE_ROOT="${EP_LAKE_ROOT:-$EP_STATE_DIR/lake}" ;;
    s3)
        STORES=(s3)
        export AWS_ENDPOINT_URL="http://127.0.0.1:${EP_S3_PORT:-19000}" AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=test \
            AWS_SECRET_ACCESS_KEY=test AWS_ALLOW_HTTP=true AWS_CONDITIONAL_PUT=etag
        export EP_LAKE_ROOT="s3://${EP_LAKE_BUCKET:-lake}/lake" EP_LANDING_ROOT="s3://${EP_LAKE_BUCKET:-lake}/landing" ;;
    azure)
        STORES=(azurite)
        export AZURE_STORAGE_ACCOUNT_NAME=devstoreaccount1 AZURE_ALLOW_HTTP=true \
            AZURE_ENDPOINT="http://127.0.0.1:${EP_AZURITE_PORT:-10000}/devstoreaccount1" \
            AZURE_STORAGE_ACCOUNT_KEY="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
        export EP_LAKE_ROOT="az://${EP_LAKE_BUCKET:-lake}/lake" EP_LANDING_ROOT="az://${EP_LAKE_BUCKET:-lake}/landing" ;;
    *) echo "run_platform: EP_DEMO_STORE must be local, s3 or azure" >&2; exit 2 ;;
esac
export EP_ZK_ROOT="${EP_ZK_ROOT:-/engagement_platform}"
# Demo cadence (streams/cadence.py): a Kafka stream plans a batch once 20,000 records wait or a minute after its
# previous batch, so the demo's trickle is not one run per sensor tick (each run is a process and a Spark job).
export EP_BATCH_MIN_RECORDS="${EP_BATCH_MIN_RECORDS:-20000}" EP_BATCH_MAX_WAIT_SECONDS="${EP_BATCH_MAX_WAIT_SECONDS:-60}"
export SPARK_LOCAL_IP=127.0.0.1

PRODUCER_PID=""
PROFILE_PRODUCER_PID=""
DAGSTER_PID=""
CLEANED=0

# Wait until pid is gone (or a timeout in seconds passes); returns 1 on timeout.
wait_gone() {
    local pid="$1" secs="$2" i
    for ((i = 0; i < secs * 5; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2
    done
    return 1
}

# Both background jobs run in their own process group (set -m), so sweep the group
# to catch children (dagster's webserver/daemon/code server, anything the producer forked).
kill_group_leftovers() {
    local pgid="$1"
    kill -0 -- "-$pgid" 2>/dev/null || return 0
    kill -TERM -- "-$pgid" 2>/dev/null || true
    sleep 2
    kill -KILL -- "-$pgid" 2>/dev/null || true
}

cleanup() {
    # Runs from the INT/TERM handler and again from EXIT; only do the work once.
    [ "$CLEANED" -eq 0 ] || return 0
    CLEANED=1
    set +e
    trap '' INT TERM HUP  # a second Ctrl-C (or the terminal closing) must not abort the shutdown
    echo "run_platform: shutting down"
    if [ -n "$PRODUCER_PID" ] && kill -0 "$PRODUCER_PID" 2>/dev/null; then
        echo "run_platform: stopping demo producer (pid $PRODUCER_PID)"
        kill -TERM "$PRODUCER_PID" 2>/dev/null
        wait_gone "$PRODUCER_PID" 10 || kill -KILL "$PRODUCER_PID" 2>/dev/null
    fi
    [ -z "$PRODUCER_PID" ] || kill_group_leftovers "$PRODUCER_PID"
    rm -f "$PID_DIR/demo-produce.pid"
    if [ -n "$PROFILE_PRODUCER_PID" ] && kill -0 "$PROFILE_PRODUCER_PID" 2>/dev/null; then
        echo "run_platform: stopping profile CDC demo producer (pid $PROFILE_PRODUCER_PID)"
        kill -TERM "$PROFILE_PRODUCER_PID" 2>/dev/null
        wait_gone "$PROFILE_PRODUCER_PID" 10 || kill -KILL "$PROFILE_PRODUCER_PID" 2>/dev/null
    fi
    [ -z "$PROFILE_PRODUCER_PID" ] || kill_group_leftovers "$PROFILE_PRODUCER_PID"
    rm -f "$PID_DIR/demo-profile-cdc.pid"
    if [ -n "$DAGSTER_PID" ] && kill -0 "$DAGSTER_PID" 2>/dev/null; then
        # dagster dev shuts down cleanly on SIGINT (it does not act on SIGTERM here).
        echo "run_platform: stopping dagster dev (pid $DAGSTER_PID)"
        kill -INT "$DAGSTER_PID" 2>/dev/null
        if ! wait_gone "$DAGSTER_PID" 20; then
            echo "run_platform: dagster dev still running after 20s, killing"
            kill -KILL "$DAGSTER_PID" 2>/dev/null
        fi
    fi
    [ -z "$DAGSTER_PID" ] || kill_group_leftovers "$DAGSTER_PID"
    rm -f "$PID_DIR/dagster.pid"
    bash "$REPO/scripts/stack.sh" stop zookeeper kafka spark "${STORES[@]}"
    echo "run_platform: stopped"
}
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
trap 'cleanup; exit 129' HUP  # terminal closed: still stop everything
trap cleanup EXIT

bash scripts/stack.sh start zookeeper kafka spark "${STORES[@]}"

# The demo producer runs for hours: topics keep EP_DEMO_TOPIC_RETENTION_MINUTES [5] of messages (standard
# retention.ms), far more than the streams' lag (about a minute), so the broker's log stays bounded.
.venv/bin/python -m engagement_platform.cli create-topics --retention-minutes "${EP_DEMO_TOPIC_RETENTION_MINUTES:-5}"
# Two store exports for the rewards_members ingest pipeline (its landing sensor picks them up).
.venv/bin/python -m engagement_platform.cli demo-landing --files 2 --rows 5000

# set -m: each background job gets its own process group, so a terminal Ctrl-C reaches only
# this script (which stops things in order) and leftovers can be swept per group.
set -m
.venv/bin/python -m engagement_platform.cli demo-produce >>"$LOG_DIR/demo-produce.log" 2>&1 </dev/null &
PRODUCER_PID=$!
# Profile CDC changes of three tenants (~20/s), plus a snapshot export of tenant01 to try the backfill with.
.venv/bin/python -m engagement_platform.cli demo-profile-cdc --snapshot-dir "$EP_STATE_DIR/exports/profiles" \
    >>"$LOG_DIR/demo-profile-cdc.log" 2>&1 </dev/null &
PROFILE_PRODUCER_PID=$!
# dagster dev only stops cleanly on SIGINT, and Python ignores SIGINT for good if it starts
# with it ignored (as when this script is itself launched in the background by another
# script). Reset SIGINT to default before exec'ing dagster so `kill -INT` always works.
.venv/bin/python -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
    .venv/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p "$DAGSTER_PORT" >>"$LOG_DIR/dagster.log" 2>&1 </dev/null &
DAGSTER_PID=$!
set +m
echo "$PRODUCER_PID" >"$PID_DIR/demo-produce.pid"
echo "$PROFILE_PRODUCER_PID" >"$PID_DIR/demo-profile-cdc.pid"
echo "$DAGSTER_PID" >"$PID_DIR/dagster.pid"
echo "run_platform: demo producer pid $PRODUCER_PID (log $LOG_DIR/demo-produce.log)"
echo "run_platform: profile CDC demo producer pid $PROFILE_PRODUCER_PID (log $LOG_DIR/demo-profile-cdc.log)"
echo "run_platform: dagster dev pid $DAGSTER_PID (log $LOG_DIR/dagster.log)"

# Ready when the webserver answers; fail fast if dagster dev dies while loading.
deadline=$((SECONDS + ${EP_DAGSTER_START_TIMEOUT:-180}))
until .venv/bin/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "http://127.0.0.1:$DAGSTER_PORT/server_info" >/dev/null 2>&1; do
    if ! kill -0 "$DAGSTER_PID" 2>/dev/null || ((SECONDS >= deadline)); then
        echo "run_platform: dagster dev did not come up; last lines of $LOG_DIR/dagster.log:" >&2
        tail -n 40 "$LOG_DIR/dagster.log" >&2 || true
        exit 1
    fi
    sleep 1
done
echo "Dagster UI: http://127.0.0.1:$DAGSTER_PORT"

# Stay in the foreground until dagster dev exits or we get INT/TERM (wait is interruptible).
set +e
wait "$DAGSTER_PID"
rc=$?
set -e
echo "run_platform: dagster dev exited with status $rc"
exit "$rc"
