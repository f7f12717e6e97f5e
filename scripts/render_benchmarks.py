"""Render BENCHMARKS.md from the benchmark records in benchmarks/results/ (benchmarks/record.py writes them).

    .venv/bin/python scripts/render_benchmarks.py          # write BENCHMARKS.md
    .venv/bin/python scripts/render_benchmarks.py --check  # exit 1 when BENCHMARKS.md is stale

The page is an intro (what each benchmark measures and its command) and one table of results, newest first.
How the figures were reached lives in docs/history/benchmarks-narrative.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: the benchmarks package lives at the repository root
from benchmarks.record import RESULTS_DIR, load_records, parse_bound  # noqa: E402

PAGE = REPO / "BENCHMARKS.md"
NARRATIVE = "docs/history/benchmarks-narrative.md"
RENDER_COMMAND = ".venv/bin/python scripts/render_benchmarks.py"

# name -> (command, what it measures): the intro's one line per benchmark
BENCHMARKS: dict[str, tuple[str, str]] = {
    "ingest": (
        ".venv/bin/python benchmarks/ingest.py",
        "Kafka engagement events ingested into engagement_activity as sensor-launched runs do, against a raw "
        "confluent-kafka read of the same offsets; the run split into Spark task seconds and the driver's serial "
        "seconds (Amdahl's speedup for 2, 8 and 32 executors), and the same offsets on a two-worker standalone "
        "cluster against local[2] (`--lake s3`: the same events again into a lake on a local S3 endpoint).",
    ),
    "ingest_plugins": (
        ".venv/bin/python benchmarks/ingest_plugins.py",
        "a dirty 1M-row CSV landing file through the composable ingest framework (converters, validators, "
        "quarantine) end to end, against a fail-fast Spark job.",
    ),
    "mutation": (
        ".venv/bin/python -u benchmarks/mutation.py",
        "id mutation requests (convert, merge, delete, update; most in cascading chains) applied to a 10M-row "
        "engagement_activity, against applying a sample one at a time; the run split into Spark task seconds and "
        "the driver's serial seconds (Amdahl's speedup for 2, 8 and 32 executors), and the same requests on a "
        "two-worker standalone cluster against local[2].",
    ),
    "profile_cdc": (
        ".venv/bin/python benchmarks/profile_cdc.py",
        "profile CDC records staged and merged into 50 tenants' raw tables, against processing tenants one at a time.",
    ),
    "profile_tenants": (
        ".venv/bin/python benchmarks/profile_tenants.py",
        "1,000 profile tenants with a change each per minute through the processor's sensor and runs on a real "
        "Dagster instance: runs per minute, processor time and CPU per minute, each tenant's lag, and each profile "
        "sensor's idle tick, against a run per tenant.",
    ),
    "segments": (
        ".venv/bin/python benchmarks/segments.py",
        "1,000 segments over 1M profile rows, full and after 1% of identities changed, against one Spark SQL query "
        "per segment; the compaction of ten incremental runs' log, and reads of one segment's current members.",
    ),
    "layout": (
        ".venv/bin/python benchmarks/layout.py",
        "layout upkeep (z-order per org, vacuum) of a fragmented table, and the files and time a one-week query "
        "takes before and after (no servers).",
    ),
    "coordination": (
        ".venv/bin/python benchmarks/coordination.py",
        "the job coordinator's lock + register + unlock latency on ZooKeeper, and three streams on one table with "
        "and without it.",
    ),
    "spark_run_overhead": (
        ".venv/bin/python benchmarks/spark_run_overhead.py",
        "what a fresh run process pays for Spark: a classic local session against a Spark Connect client.",
    ),
    "control_plane": (
        ".venv/bin/python benchmarks/control_plane.py",
        "the platform's fixed costs: CPU and wall time per run of a step that does nothing, forked from the run pool "
        "against a new interpreter per run; every sensor's idle tick against the same tick with the table cache "
        "cleared; the cores an idle platform keeps busy.",
    ),
    "demo_health": (
        ".venv/bin/python -u benchmarks/demo_health.py --minutes 30 --warmup-minutes 5",
        "the demo (scripts/run_platform.sh) on this machine: load average, RSS growth, failed runs and sensor ticks.",
    ),
    "soak": (
        ".venv/bin/python -u -m benchmarks.soak --seed S --minutes M --faults F [--max-concurrent-faults 2 | --spaced]",
        "the platform and its daemon under a seeded workload while faults are injected, every table reconciled "
        "with an independent oracle; time until every stream is back to committing, per fault kind.",
    ),
}

INTRO = f"""# Benchmarks

Each benchmark runs on its own state folder under `.state/` (most start their own copy of the stack), measures a
baseline in the same run where one exists, and ends by writing its result as a JSON record in
`benchmarks/results/` (`benchmarks/record.py`). This page is generated from those records by
`{RENDER_COMMAND}`, and a test fails when it is stale. The machines are noisy:
compare a result with the baseline of the same run, and read the load average before and after it.

## What each benchmark measures
"""

COLUMNS = ("benchmark", "command", "input", "machine", "load before → after", "result", "target", "date")


def cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def number(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def described(key: str) -> tuple[str, str]:
    """A figure's label and unit from its key: events_per_s -> events/s, merge_s -> s, *_share and *_growth -> %."""
    if key.endswith("_per_s"):
        return key[: -len("_per_s")].replace("_", " ") + "/s", ""
    if key.endswith(("_share", "_growth")):
        return key.replace("_", " "), "%"
    for suffix, unit in (("_ms", "ms"), ("_s", "s")):
        if key.endswith(suffix):
            return key[: -len(suffix)].replace("_", " "), unit
    return key.replace("_", " "), ""


def value_text(value: Any, unit: str) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return number(value)
    if unit == "%":
        return f"{value:.1%}".replace(".0%", "%")
    return f"{number(value)} {unit}" if unit else number(value)


def figure(key: str, value: Any) -> str:
    label, unit = described(key)
    return f"{label} {value_text(value, unit)}"


def bound(key: str, text: str) -> str:
    op, limit = parse_bound(text)
    label, unit = described(key)
    return f"{label} {op} {value_text(limit, unit)}"


def result_text(record: dict[str, Any]) -> str:
    parts = ["; ".join(figure(k, v) for k, v in record["result"].items())]
    baseline = record.get("baseline")
    if baseline:
        what = baseline.get("what")
        figures = "; ".join(figure(k, v) for k, v in baseline.items() if k != "what")
        parts.append("baseline" + (f" ({what})" if what else "") + (f": {figures}" if figures else ""))
    if record.get("note"):
        parts.append(record["note"])
    return " — ".join(parts)


def target_text(record: dict[str, Any]) -> str:
    target = record["target"]
    if target is None:
        return "-"
    text = target if isinstance(target, str) else "; ".join(bound(k, v) for k, v in target.items())
    verdict = {True: "**met**", False: "**not met**", None: ""}[record["met"]]
    return f"{text}: {verdict}" if verdict else text


def load_text(load: dict[str, Any]) -> str:
    shown = " → ".join("-" if load.get(k) is None else f"{load[k]:.2f}" for k in ("before", "after"))
    return f"{shown} ({load['note']})" if load.get("note") else shown


def machine_text(machine: dict[str, Any]) -> str:
    text = ", ".join(
        str(part)
        for part in (
            machine.get("cores") and f"{machine['cores']} cores",
            machine.get("memory_gib") and f"{machine['memory_gib']} GiB",
            machine.get("python"),
        )
        if part
    )
    return f"{text} ({machine['note']})" if machine.get("note") else text


def row(record: dict[str, Any]) -> str:
    date = record["date"] + (f" ({record['commit']})" if record.get("commit") else "")
    cells = (
        record["benchmark"],
        f"`{record['command']}`",
        record["input"],
        machine_text(record["machine"]),
        load_text(record["load"]),
        result_text(record),
        target_text(record),
        date,
    )
    return "| " + " | ".join(cell(c) for c in cells) + " |"


def render(records: list[dict[str, Any]]) -> str:
    lines = [INTRO]
    for name, (command, what) in BENCHMARKS.items():
        lines.append(f"- **{name}** (`{command}`): {what}")
    lines += [
        "",
        "## Results, newest first",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + " --- |" * len(COLUMNS),
    ]
    lines += [row(r) for r in records]
    lines += [
        "",
        f"How these figures were reached (method notes, profiles, the runs before these, every soak's diary): "
        f"[{NARRATIVE}]({NARRATIVE}).",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when BENCHMARKS.md is not what the records give")
    args = parser.parse_args()
    text = render(load_records(RESULTS_DIR))
    if args.check:
        if PAGE.read_text() != text:
            print(f"BENCHMARKS.md is stale against benchmarks/results/: run {RENDER_COMMAND}")
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(REPO)} from {len(load_records(RESULTS_DIR))} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
