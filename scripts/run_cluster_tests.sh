#!/usr/bin/env bash
# The cluster tier: install, the lint and type gate, then the tests that show a batch works when its Spark tasks run
# in executors that share nothing with the driver but the lake's URL. The suite's stack starts with a Spark standalone
# cluster (a master and two workers of one core each, each worker with its own folders and environment; see
# scripts/stack.sh, `cluster`) instead of local[2], and every lake is on the S3 endpoint (moto_server). It runs:
# test_cluster.py (tasks on both workers and none on the driver; executors see none of the driver's environment or
# folders), every S3 case of test_object_store.py (a batch of every stream), the crash tests of ingestion and
# mutation, and the sensors driving the profile streams and an ingestion materialization end to end. Serial: the
# cluster's two workers already take both cores. Extra arguments go to pytest.
#
#   bash scripts/run_cluster_tests.sh
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export EP_TEST_CLUSTER=1
exec bash "$REPO/scripts/run_tests.sh" --durations=20 "$@"
