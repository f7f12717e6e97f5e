#!/usr/bin/env bash
# The lint and type gate: ruff (lint, then the format check) and mypy, each configured in pyproject.toml.
# One line per step; the first step that fails prints its output and ends the gate with its exit status.
# scripts/run_tests.sh runs it before the tests.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT

step() {
    local name="$1"
    shift
    local started=$SECONDS status=0
    "$@" >"$OUT" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then
        echo "lint: $name FAILED (exit $status)"
        cat "$OUT"
        exit "$status"
    fi
    echo "lint: $name ok ($((SECONDS - started)) s)"
}

step "ruff check" .venv/bin/ruff check .
step "ruff format --check" .venv/bin/ruff format --check .
step "mypy" .venv/bin/mypy
