#!/usr/bin/env bash
# Idempotent local setup: ZooKeeper + Java 17 from apt, .venv with the project installed.
# A second run only checks files and exits, so every other script can call it first.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

say() { printf 'install: %s\n' "$*"; }

# run_tests.sh and run_platform.sh may start together: one install at a time.
# Locking this (tracked) script file avoids creating a lock file anywhere.
exec 9<"$REPO/scripts/install.sh"
flock 9

# Only escalate when needed; CI containers run as root without sudo.
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

APT_UPDATED=0
apt_install() {
    # One `apt-get update` per run, and only when something is actually missing.
    if [ "$APT_UPDATED" -eq 0 ]; then
        $SUDO apt-get update
        APT_UPDATED=1
    fi
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"
}

java_major() {
    # `java -version` prints e.g. openjdk version "17.0.15" on stderr.
    java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1
}

# --- ZooKeeper (Debian package; we only use its jars, never its service) ---
if [ -f /usr/share/java/zookeeper.jar ]; then
    say "zookeeper: present (/usr/share/java/zookeeper.jar)"
else
    say "zookeeper: missing, installing from apt"
    apt_install zookeeper
fi

# --- Java 17 (ZooKeeper and the Spark Connect server are JVM processes) ---
if ! command -v java >/dev/null 2>&1; then
    say "java: missing, installing openjdk-17-jre-headless"
    apt_install openjdk-17-jre-headless
fi
JMAJ="$(java_major)"
if [ -z "$JMAJ" ] || [ "$JMAJ" -lt 17 ]; then
    # Spark 4 needs Java 17+; don't silently continue on an old default JVM.
    echo "install: java on PATH is version '${JMAJ:-unknown}', Spark 4 needs 17+;" \
         "install openjdk-17-jre-headless and select it with update-alternatives" >&2
    exit 1
fi
say "java: version $JMAJ"

# --- Python virtualenv ---
if [ -x .venv/bin/python ]; then
    say "venv: present ($(.venv/bin/python -V 2>&1))"
else
    # The project pins requires-python to 3.11; prefer that interpreter explicitly.
    PYBIN=""
    for cand in python3.11 python3; do
        if command -v "$cand" >/dev/null 2>&1 \
           && "$cand" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
            PYBIN="$cand"; break
        fi
    done
    if [ -z "$PYBIN" ]; then
        echo "install: no Python 3.11 found (tried python3.11, python3)" >&2
        exit 1
    fi
    say "venv: creating .venv with $PYBIN"
    "$PYBIN" -m venv .venv
fi

# --- Python packages, skipped when pyproject.toml and constraints.txt are unchanged ---
HASH="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
STAMP=".venv/.installed-$HASH"
if [ -f "$STAMP" ]; then
    say "pip: up to date (stamp $STAMP), skipped"
else
    say "pip: installing -e '.[dev,cluster]' with constraints.txt"
    .venv/bin/python -m pip install -c constraints.txt -e '.[dev,cluster]'
    # Drop stamps of older dependency sets so only the current one counts.
    rm -f .venv/.installed-*
    touch "$STAMP"
    say "pip: done, wrote $STAMP"
fi

# --- Azurite (Azure's storage emulator, npm registry) for the ADLS tests; pinned, installed once ---
AZURITE_VERSION="3.37.0"
AZURITE_DIR=".state/tools/azurite-$AZURITE_VERSION"
if [ -x "$AZURITE_DIR/node_modules/.bin/azurite-blob" ]; then
    say "azurite: present ($AZURITE_DIR)"
else
    command -v npm >/dev/null 2>&1 || apt_install nodejs npm
    say "azurite: installing azurite@$AZURITE_VERSION into $AZURITE_DIR"
    mkdir -p "$AZURITE_DIR"
    npm install --silent --no-audit --no-fund --prefix "$AZURITE_DIR" "azurite@$AZURITE_VERSION"
fi
