"""One JSON record per benchmark run in benchmarks/results/, which scripts/render_benchmarks.py turns into
BENCHMARKS.md.

A record holds what a reader needs to trust a figure: the command, the input, the machine, the load before and
after, the headline figures, the bound they are held to and whether they meet it, the date and the commit.

    record_result("ingest", invocation(), "2,000,000 events, 4 partitions", {"events_per_s": 47754},
                  target={"events_per_s": ">= 100000"}, baseline={"what": "raw read", "events_per_s": 272900})

A bound is "<op> <value>" with op one of >=, <=, >, <, ==; `met` holds when every bound whose figure the run
produced holds (None when the run produced none of them, or the record has no target).

Where records go: EP_BENCHMARK_RESULTS_DIR when set, else benchmarks/results/. A benchmark started by a test
(pytest sets PYTEST_CURRENT_TEST, which the benchmark's process inherits) writes nothing unless that variable
says where: a test run must not change the repository's results.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"
SCHEMA = 1
REQUIRED = (
    "schema",
    "benchmark",
    "command",
    "input",
    "machine",
    "load",
    "result",
    "target",
    "met",
    "date",
    "recorded_at",
    "commit",
)
BOUND = re.compile(r"^\s*(>=|<=|==|>|<)\s*(.+?)\s*$")
LOAD_AT_START = os.getloadavg()[0]  # benchmarks import this module first thing: the load before their work


def invocation() -> str:
    """The command line this process was started with, paths inside the repository made relative to it."""
    args = []
    for arg in sys.orig_argv:
        path = Path(arg)
        if path.is_absolute() and path.is_relative_to(REPO):
            arg = str(path.relative_to(REPO))
        args.append(arg)
    return shlex.join(args)


def machine_facts() -> dict[str, Any]:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(memory),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": platform.system(),
    }


def git_commit() -> tuple[str | None, bool | None]:
    """HEAD's short hash, and whether tracked files differ from it (the figure then measured uncommitted code)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return head, bool(status.strip())


def parse_bound(bound: str) -> tuple[str, float | str]:
    match = BOUND.match(bound)
    if not match:
        raise ValueError(f"a bound is '<op> <value>' with op one of >=, <=, >, <, ==: {bound!r}")
    op, text = match.groups()
    try:
        return op, float(text.replace(",", ""))
    except ValueError:
        return op, text


def holds(value: Any, bound: str) -> bool:
    op, limit = parse_bound(bound)
    if op == "==":
        return value == limit
    if isinstance(limit, str) or isinstance(value, (str, bool)) or value is None:
        return False
    return {">=": value >= limit, "<=": value <= limit, ">": value > limit, "<": value < limit}[op]


def bounds_met(result: dict[str, Any], target: dict[str, str] | str | None) -> bool | None:
    """Whether every bound whose figure is in the result holds; None when none is (or the target is prose)."""
    if not isinstance(target, dict):
        return None
    checked = [holds(result[key], bound) for key, bound in target.items() if key in result]
    return all(checked) if checked else None


def at_defaults(parser, args, ignore: tuple[str, ...] = ()) -> bool:
    """Whether the run used the parser's default input (a bound stated for the default input applies only then)."""
    defaults = vars(parser.parse_args([]))
    return all(value == defaults.get(key) for key, value in vars(args).items() if key not in ignore)


def results_dir() -> Path | None:
    if os.environ.get("EP_BENCHMARK_RESULTS_DIR"):
        return Path(os.environ["EP_BENCHMARK_RESULTS_DIR"])
    return None if os.environ.get("PYTEST_CURRENT_TEST") else RESULTS_DIR


def file_name(record: dict[str, Any]) -> str:
    stamp = record["recorded_at"].replace(":", "")[:17]  # 2026-11-27T050247
    return f"{record['benchmark']}-{stamp}-{record['commit'] or 'nocommit'}.json"


def write_record(record: dict[str, Any], folder: Path) -> Path:
    problems = validate(record)
    if problems:
        raise ValueError(f"not a valid benchmark record: {problems}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(record)
    n = 2
    while path.exists():  # two runs in the same second on the same commit
        path = folder / file_name(record).replace(".json", f"-{n}.json")
        n += 1
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return path


def record_result(
    benchmark: str,
    command: str,
    input: str,
    result: dict[str, Any],
    *,
    target: dict[str, str] | str | None = None,
    baseline: dict[str, Any] | None = None,
    met: bool | None = None,
    load_before: float | None = None,
    note: str | None = None,
    folder: Path | None = None,
) -> Path | None:
    """Write this run's record; returns its path (None when a test started the benchmark without a folder)."""
    folder = folder or results_dir()
    now = datetime.now(UTC).replace(microsecond=0)
    commit, dirty = git_commit()
    record = {
        "schema": SCHEMA,
        "benchmark": benchmark,
        "command": command,
        "input": input,
        "machine": machine_facts(),
        "load": {
            "before": round(LOAD_AT_START if load_before is None else load_before, 2),
            "after": round(os.getloadavg()[0], 2),
        },
        "result": result,
        "baseline": baseline,
        "target": target,
        "met": bounds_met(result, target) if met is None else met,
        "note": note,
        "date": now.date().isoformat(),
        "recorded_at": now.isoformat(),
        "commit": commit,
        "dirty": dirty,
        "source": "run",
    }
    if folder is None:
        print(f"benchmark record not written (started by a test; set EP_BENCHMARK_RESULTS_DIR to keep it): {record}")
        return None
    path = write_record(record, folder)
    print(f"recorded: {path}; render BENCHMARKS.md with .venv/bin/python scripts/render_benchmarks.py")
    return path


def validate(record: dict[str, Any]) -> list[str]:
    """What is wrong with a record (empty when it is well formed)."""
    problems = [f"missing {key}" for key in REQUIRED if key not in record]
    if problems:
        return problems
    if record["schema"] != SCHEMA:
        problems.append(f"schema {record['schema']!r}, expected {SCHEMA}")
    for key in ("benchmark", "command", "input", "date", "recorded_at"):
        if not isinstance(record[key], str) or not record[key]:
            problems.append(f"{key} is not a non-empty string")
    if not isinstance(record["result"], dict) or not record["result"]:
        problems.append("result is not a non-empty dict of figures")
    if not isinstance(record["load"], dict) or not {"before", "after"} <= set(record["load"]):
        problems.append("load has no before / after")
    if not isinstance(record["machine"], dict):
        problems.append("machine is not a dict")
    if record["met"] is not None and not isinstance(record["met"], bool):
        problems.append("met is not true, false or null")
    target = record["target"]
    if isinstance(target, dict):
        for key, bound in target.items():
            try:
                parse_bound(bound)
            except (TypeError, ValueError) as exc:
                problems.append(f"target {key}: {exc}")
    elif target is not None and not isinstance(target, str):
        problems.append("target is not a dict of bounds, a sentence or null")
    try:
        datetime.fromisoformat(record["recorded_at"])
        datetime.strptime(record["date"], "%Y-%m-%d")
    except (TypeError, ValueError):
        problems.append("date or recorded_at is not ISO 8601")
    return problems


def load_records(folder: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """Every record in the folder, newest first (by recorded_at, then benchmark)."""
    records = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        problems = validate(record)
        if problems:
            raise ValueError(f"{path.relative_to(folder)}: {problems}")
        records.append(record)
    return sorted(records, key=lambda r: (r["recorded_at"], r["benchmark"], r["command"]), reverse=True)
