#!/usr/bin/env bash
# Test entry point: make sure the environment is installed, then hand over to pytest.
# The suite's conftest starts its own stack via scripts/stack.sh (test ports, test state
# dir), so no servers are started here. Extra arguments go straight to pytest.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Run from the repo root so pytest picks up setup.cfg ([tool:pytest]).
cd "$REPO"

bash scripts/install.sh
exec .venv/bin/python -m pytest "$@"
