"""Per-run Spark overhead of a sensor-launched run: classic in-process session vs Spark Connect.

    .venv/bin/python benchmarks/spark_run_overhead.py [--repeats 3]

Every Dagster run is a fresh process. Each option is measured in fresh child processes, twice:
  session   : create the session and run a first tiny job (what a run's first Spark call pays)
  dagster   : materialize a one-asset Spark job with the in-process executor (the whole run)
The Connect server itself is started once (reported separately), as scripts/stack.sh does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stack import bench_stack, machine  # noqa: E402
from record import invocation, record_result  # noqa: E402

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
mode, what = sys.argv[1], sys.argv[2]
config = {"spark.remote": sys.argv[3]} if mode == "connect" else {}
if what == "session":
    from engagement_platform.spark.session import build_session, session_config
    t_import = time.perf_counter()
    spark = build_session(config or session_config("", "local[2]"))
    assert spark.range(1000).selectExpr("sum(id)").collect()[0][0] == 499500
    print(json.dumps({"seconds": time.perf_counter() - t_import}))
else:
    from dagster import asset, materialize, in_process_executor
    from engagement_platform.resources import SparkResource
    from engagement_platform.spark.session import session_config

    @asset
    def tiny(spark: SparkResource) -> int:
        return spark.spark_session.range(1000).selectExpr("sum(id)").collect()[0][0]

    t_import = time.perf_counter()
    result = materialize([tiny], resources={"spark": SparkResource(spark_config=config or session_config("", "local[2]"))})
    assert result.success and result.output_for_node("tiny") == 499500
    print(json.dumps({"seconds": time.perf_counter() - t_import, "with_imports": time.perf_counter() - t0}))
"""


def run_child(mode: str, what: str, remote: str) -> dict:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, what, remote], env=env, capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process"] = time.perf_counter() - t
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with bench_stack("spark-overhead", servers=("spark",)) as env:
        remote = env["SPARK_REMOTE"]
        rows = {}
        for what in ("session", "dagster"):
            for mode in ("classic", "connect"):
                runs = [run_child(mode, what, remote) for _ in range(args.repeats)]
                rows[(what, mode)] = (
                    statistics.median(r["seconds"] for r in runs),
                    statistics.median(r["process"] for r in runs),
                )
    print(f"machine: {machine()}")
    print(f"Spark Connect server start (once, with the stack): {env['stack_start_seconds']:.1f} s")
    print(f"medians of {args.repeats} fresh processes each")
    print(f"{'measure':<10} {'mode':<8} {'spark part (s)':>15} {'whole process (s)':>18}")
    for (what, mode), (spark_s, proc_s) in rows.items():
        print(f"{what:<10} {mode:<8} {spark_s:>15.2f} {proc_s:>18.2f}")
    for what in ("session", "dagster"):
        c, k = rows[(what, "classic")][0], rows[(what, "connect")][0]
        print(f"{what}: connect saves {c - k:.2f} s per run (classic/connect = {c / k:.1f}x)")
    record_result(
        "spark_run_overhead",
        invocation(),
        f"{args.repeats} fresh processes per measure and mode, medians; a one-asset Spark job with the in-process executor",
        {
            "classic_session_first_job_s": round(rows[("session", "classic")][0], 2),
            "connect_session_first_job_s": round(rows[("session", "connect")][0], 2),
            "classic_run_spark_part_s": round(rows[("dagster", "classic")][0], 2),
            "connect_run_spark_part_s": round(rows[("dagster", "connect")][0], 2),
            "classic_run_whole_process_s": round(rows[("dagster", "classic")][1], 2),
            "connect_run_whole_process_s": round(rows[("dagster", "connect")][1], 2),
            "connect_saves_per_run_s": round(rows[("dagster", "classic")][0] - rows[("dagster", "connect")][0], 2),
        },
    )


if __name__ == "__main__":
    main()
