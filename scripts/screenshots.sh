#!/usr/bin/env bash
# Refresh the README's screenshots (docs/images/*.png): start the demo (scripts/run_platform.sh), let it run
# EP_SCREENSHOT_WARMUP seconds [420] so every stream, the metrics consumer and the checks have run, shoot the UI
# with headless Chromium (Debian's chromium, driven by Playwright), stop the demo.
# With EP_SCREENSHOT_URL set (e.g. http://127.0.0.1:3000) it shoots a demo that is already running instead.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

bash scripts/install.sh
if [ ! -x /usr/bin/chromium ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get install -y -q chromium >/dev/null || { $SUDO apt-get update -q && $SUDO apt-get install -y -q chromium; }
fi
# Playwright drives the system Chromium (no browser download); pinned like everything else.
.venv/bin/python -c 'import playwright' 2>/dev/null || .venv/bin/pip install -q -c constraints.txt playwright

if [ -n "${EP_SCREENSHOT_URL:-}" ]; then
    exec .venv/bin/python scripts/screenshots.py --url "$EP_SCREENSHOT_URL" "$@"
fi
export EP_STATE_DIR="${EP_STATE_DIR:-$REPO/.state/screenshots}"
rm -rf "$EP_STATE_DIR"
setsid bash scripts/run_platform.sh >"/tmp/screenshots-platform.$$.log" 2>&1 &
PLATFORM=$!
trap 'kill -TERM "$PLATFORM" 2>/dev/null; wait "$PLATFORM" 2>/dev/null || true' EXIT
port="${EP_DAGSTER_PORT:-3000}"
until .venv/bin/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "http://127.0.0.1:$port/server_info" 2>/dev/null; do
    kill -0 "$PLATFORM" 2>/dev/null || { echo "screenshots: the demo did not start (/tmp/screenshots-platform.$$.log)" >&2; exit 1; }
    sleep 2
done
echo "screenshots: demo up, letting it run ${EP_SCREENSHOT_WARMUP:-420} s"
sleep "${EP_SCREENSHOT_WARMUP:-420}"
.venv/bin/python scripts/screenshots.py --url "http://127.0.0.1:$port" "$@"
