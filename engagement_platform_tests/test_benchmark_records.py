"""Benchmark records (benchmarks/record.py) and the page rendered from them (scripts/render_benchmarks.py): what a
record holds, when it meets its target, and that BENCHMARKS.md is the rendering of benchmarks/results/. No servers."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.record import (
    RESULTS_DIR,
    SCHEMA,
    bounds_met,
    load_records,
    record_result,
    results_dir,
    validate,
    write_record,
)

REPO = Path(__file__).resolve().parent.parent
HISTORY = re.compile(r"\b(session|soak run|issues?|stop) \d+\b|\breference 00\d\b", re.IGNORECASE)


def _renderer():
    spec = importlib.util.spec_from_file_location("render_benchmarks", REPO / "scripts" / "render_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("render_benchmarks", module)
    spec.loader.exec_module(module)
    return module


def a_record(benchmark: str, recorded_at: str, **changes) -> dict:
    return {
        "schema": SCHEMA,
        "benchmark": benchmark,
        "command": f".venv/bin/python benchmarks/{benchmark}.py",
        "input": "2,000,000 events",
        "machine": {"cores": 2, "memory_gib": 24, "python": "CPython 3.11.7", "os": "Linux"},
        "load": {"before": 0.45, "after": 1.69},
        "result": {"events_per_s": 47754, "ratio_to_baseline": 0.17},
        "baseline": {"what": "raw read", "events_per_s": 272900},
        "target": {"events_per_s": ">= 100000"},
        "met": False,
        "note": None,
        "date": recorded_at[:10],
        "recorded_at": recorded_at,
        "commit": "c8cae78",
        "dirty": False,
        "source": "run",
        **changes,
    }


def test_a_record_holds_command_input_machine_load_figures_target_and_commit(tmp_path):
    path = record_result(
        "ingest",
        ".venv/bin/python benchmarks/ingest.py --no-scaling",
        "2,000,000 events, 4 partitions",
        {"events_per_s": 47754, "ratio_to_baseline": 0.17},
        target={"events_per_s": ">= 100000", "ratio_to_baseline": ">= 0.4"},
        baseline={"what": "confluent-kafka exact-range read only", "events_per_s": 272900},
        load_before=0.45,
        folder=tmp_path,
    )
    record = json.loads(path.read_text())
    assert validate(record) == []
    assert path.name.startswith(f"ingest-{record['date']}T") and path.suffix == ".json"
    assert record["command"] == ".venv/bin/python benchmarks/ingest.py --no-scaling"
    assert record["machine"]["cores"] == os.cpu_count() and record["machine"]["python"].startswith("CPython 3.11")
    assert record["load"]["before"] == 0.45 and isinstance(record["load"]["after"], float)
    assert record["result"] == {"events_per_s": 47754, "ratio_to_baseline": 0.17}
    assert record["met"] is False  # neither bound holds
    assert record["baseline"]["events_per_s"] == 272900
    assert record["commit"] is None or re.fullmatch(r"[0-9a-f]{7,}", record["commit"])
    assert record["source"] == "run"
    # a second run in the same second on the same commit does not overwrite the first
    again = record_result("ingest", "cmd", "input", {"events_per_s": 1}, folder=tmp_path)
    assert again != path and len(list(tmp_path.glob("*.json"))) == 2


def test_met_holds_when_every_bound_the_run_measured_holds():
    target = {"events_per_s": ">= 100000", "speedup_local2_vs_local1": ">= 1.6", "driver_cpu_share": "<= 0.25"}
    assert bounds_met({"events_per_s": 120000, "driver_cpu_share": 0.06}, target) is True  # no scaling run: skipped
    assert bounds_met({"events_per_s": 120000, "driver_cpu_share": 0.3}, target) is False
    assert bounds_met({"rows_per_s": 1}, target) is None  # none of the bounds measured
    assert bounds_met({"events_per_s": 1}, None) is None
    assert bounds_met({"events_per_s": 1}, "every table exact") is None  # a prose target is judged by hand
    soak = {"verdict": "== PASS", "back_to_committing_worst_median_s": "<= 120"}
    assert bounds_met({"verdict": "PASS", "back_to_committing_worst_median_s": 69}, soak) is True
    assert bounds_met({"verdict": "FAIL", "back_to_committing_worst_median_s": 69}, soak) is False
    assert bounds_met({"verdict": "PASS", "back_to_committing_worst_median_s": "never"}, soak) is False
    assert bounds_met({"failed_runs": 0, "load_1min_mean": 1.99}, {"failed_runs": "== 0", "load_1min_mean": "< 2.0"})


def test_a_malformed_record_is_refused(tmp_path):
    with pytest.raises(ValueError, match="target events_per_s"):
        write_record(
            a_record("ingest", "2026-11-26T13:40:31+00:00", target={"events_per_s": "at least 100k"}), tmp_path
        )
    broken = a_record("ingest", "2026-11-26T13:40:31+00:00")
    del broken["command"]
    (tmp_path / "ingest-broken.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="ingest-broken.json.*missing command"):
        load_records(tmp_path)


def test_the_page_is_an_intro_and_one_table_of_results_newest_first(tmp_path):
    render = _renderer()
    write_record(a_record("ingest", "2026-11-26T13:40:31+00:00"), tmp_path)
    write_record(
        a_record(
            "soak",
            "2026-11-27T05:02:47+00:00",
            command=".venv/bin/python -u -m benchmarks.soak --seed 79 --spaced",
            result={"verdict": "PASS", "back_to_committing_worst_median_s": 69},
            target={"verdict": "== PASS", "back_to_committing_worst_median_s": "<= 120"},
            met=True,
            baseline=None,
            load={"before": None, "after": None, "note": "not stated"},
        ),
        tmp_path,
    )
    page = render.render(load_records(tmp_path))
    rows = [
        line for line in page.splitlines() if line.startswith("| ") and not line.startswith(("| benchmark", "| ---"))
    ]
    assert [row.split(" | ")[0] for row in rows] == ["| soak", "| ingest"]  # newest first
    assert page.count("| benchmark | command | input | machine |") == 1
    assert "back to committing worst median 69 s" in rows[0] and "**met**" in rows[0]
    assert "- → - (not stated)" in rows[0]
    assert "events/s 47,754; ratio to baseline 0.17" in rows[1] and "events/s >= 100,000: **not met**" in rows[1]
    assert "baseline (raw read): events/s 272,900" in rows[1] and "0.45 → 1.69" in rows[1]
    assert "2026-11-26 (c8cae78)" in rows[1]
    for name, (command, _) in render.BENCHMARKS.items():
        assert f"- **{name}** (`{command}`)" in page
    assert "(docs/history/benchmarks-narrative.md)" in page


def test_benchmarks_md_is_the_rendering_of_the_stored_records():
    render = _renderer()
    records = load_records(RESULTS_DIR)
    assert records, "benchmarks/results/ holds no record"
    unknown = {r["benchmark"] for r in records} - set(render.BENCHMARKS)
    assert not unknown, f"records of benchmarks the page does not introduce: {unknown}"
    assert (REPO / "BENCHMARKS.md").read_text() == render.render(records), (
        f"BENCHMARKS.md is stale against benchmarks/results/: run {render.RENDER_COMMAND}"
    )


def test_the_render_script_checks_the_page_from_the_command_line():
    done = subprocess.run(
        [sys.executable, "scripts/render_benchmarks.py", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_page_and_the_records_tell_no_history():
    page = (REPO / "BENCHMARKS.md").read_text()
    assert not HISTORY.findall(page)
    for path in RESULTS_DIR.glob("*.json"):
        assert not HISTORY.search(path.read_text()), path.name
    assert (REPO / _renderer().NARRATIVE).exists()


def test_a_benchmark_a_test_starts_writes_no_record_unless_told_where(monkeypatch, tmp_path):
    monkeypatch.delenv("EP_BENCHMARK_RESULTS_DIR", raising=False)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "a test")  # what a benchmark's process inherits from pytest
    assert results_dir() is None
    assert record_result("soak", "cmd", "input", {"verdict": "PASS"}) is None
    monkeypatch.setenv("EP_BENCHMARK_RESULTS_DIR", str(tmp_path))
    assert results_dir() == tmp_path
    monkeypatch.delenv("EP_BENCHMARK_RESULTS_DIR")
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    assert results_dir() == RESULTS_DIR
