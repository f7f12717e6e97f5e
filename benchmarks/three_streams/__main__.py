"""Run the three-stream study against ZooKeeper and draw its timeline.

    .venv/bin/python -m benchmarks.three_streams --out docs/three_streams_timeline.png

Needs ZooKeeper (`bash scripts/stack.sh start zookeeper`); about 10 s; prints both runs' figures.
"""

from __future__ import annotations

import argparse
import json

from benchmarks.three_streams.simulation import Workload, run_both_modes
from benchmarks.three_streams.timeline import draw_timeline
from engagement_platform.settings import load_settings


def main() -> None:
    parser = argparse.ArgumentParser(
        description="three simulated streams on a temporary Delta table, with and without the coordinator"
    )
    parser.add_argument("--out", default="docs/three_streams_timeline.png", help="timeline PNG to write")
    parser.add_argument("--ingestion", type=int, default=16, help="ingestion batches (fast cadence)")
    parser.add_argument("--mutation", type=int, default=5, help="mutation batches (medium cadence)")
    parser.add_argument("--retention", type=int, default=3, help="retention batches (slow cadence)")
    args = parser.parse_args()
    workload = Workload().scaled(ingestion=args.ingestion, mutation=args.mutation, retention=args.retention)
    results = run_both_modes(load_settings().zookeeper_hosts, workload)
    for result in results:
        print(json.dumps(result.summary()))
    print(f"timeline: {draw_timeline(list(results), args.out)}")


if __name__ == "__main__":
    main()
