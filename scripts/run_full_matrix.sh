#!/usr/bin/env bash
# The full matrix, for a release or a change to the fault paths: install, the lint and type gate, then every test
# with no marker filter: the default tier plus those marked `matrix` (the long soak, every host-crash case, the
# object-store case of every crash test), with the 40 slowest tests listed at the end. Extra arguments go to pytest.
#
#   bash scripts/run_full_matrix.sh
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec bash "$REPO/scripts/run_tests.sh" -m "not cluster" --durations=40 "$@"
