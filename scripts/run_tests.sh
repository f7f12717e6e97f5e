#!/usr/bin/env bash
# The README's test command, and CI's (.ci/run): install, the lint and type gate (scripts/lint.sh), then pytest.
#
#   bash scripts/run_tests.sh          the default tier: every test not marked `matrix` or `cluster`, the short soak
#                                      and one host-crash case among them, on two workers (pytest-xdist)
#   bash scripts/run_tests.sh ARGS...  pytest with ARGS instead of the default tier's filter, for example
#                                      -m "not stack" (the unit tier: no stack server) or a test file or node id
#   bash scripts/run_full_matrix.sh    the full matrix: every test but the cluster tier's own (the long soak, every
#                                      host-crash case, every store)
#   bash scripts/run_cluster_tests.sh  the cluster tier: a batch of every stream and the crash tests of ingestion and
#                                      mutation on a Spark standalone cluster, the lake on the S3 endpoint
#
# The markers that make the tiers are declared in setup.cfg and assigned in engagement_platform_tests/conftest.py.
# The 20 slowest tests are listed at the end. The suite's conftest starts its own stack via scripts/stack.sh (test
# ports, test state dir), so no servers are started here.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Run from the repo root so pytest picks up setup.cfg ([tool:pytest]).
cd "$REPO"

bash scripts/install.sh
if [ -f scripts/lint.sh ]; then
    bash scripts/lint.sh # a finding fails the run before any test starts
fi
if [ "$#" -eq 0 ]; then
    # Two workers share one stack (the machine's CPU is half idle in a serial run: tests wait on servers and
    # timeouts); a file stays on one worker; the longest files start first (conftest orders them).
    set -- -m "not matrix and not cluster" -n 2 --dist loadfile --no-loadscope-reorder
fi
exec .venv/bin/python -m pytest --durations=20 "$@"
