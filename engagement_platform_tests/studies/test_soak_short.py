"""The soak (benchmarks/soak) in the test command: the platform with its daemon and every sensor under the soak's
seeded workload while faults are injected (run kills and pauses past the ZooKeeper session, daemon kills, broker /
ZooKeeper / Spark restarts, ZooKeeper session expiry), then every table reconciled with the oracle, which imports
nothing from the platform. The soak runs its own stack on its own ports, so it is a subprocess here; it fails on
any lost, duplicated, wrong or unaccounted record, any failing check, or a platform that did not catch up.

- The short soak (default tier, sized for about 3 minutes): one minute of rounds, one a second, so the window holds
  every feature of the workload (an erasure, landing files, a profile erasure, a TTL retention request); seven faults,
  every kind once, planned within its first 40 s and up to four at once, so each finds its slot before the window
  closes; a pending request's age horizon of 60 s, so a request whose target the broker lost expires within the
  catch-up bound. Every kind must have been injected and every table must match its oracle, none of them empty.
- The long soak (full matrix only): seven minutes, 50 faults of random kinds, two at a time.

Both keep their whole report in .state/soak-<seed>/report.txt for a person reading the run."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from benchmarks.soak.faults import KINDS
from benchmarks.soak.reconcile import QUARANTINES
from benchmarks.soak.workload import LANDING, TENANTS
from engagement_platform_tests.support.stack import REPO

SHORT = {
    "--seed": "125",  # its fault plan puts the two ZooKeeper faults early, so the second one's target frees in time
    "--minutes": "1",
    "--round-seconds": "1",
    "--faults": "7",
    "--every-kind": None,
    "--fault-minutes": "0.67",
    "--max-concurrent-faults": "4",
    "--pending-max-age-seconds": "60",
    "--catch-up-minutes": "4",  # beside the default tier's other worker, catching up took over 2 minutes once
    "--settle-seconds": "10",
}
LONG = {
    "--seed": "11",
    "--minutes": "7",
    "--faults": "50",
    "--max-concurrent-faults": "2",
    # catching up must outlast a pending request's 240 s age horizon after the last mutation batch that saw it
    "--catch-up-minutes": "12",
    "--settle-seconds": "20",
}
# Every table the soak reconciles (benchmarks/soak/reconcile.py lake_diff), by the name its report line starts with.
TABLES = (
    "engagement_activity",
    *QUARANTINES.values(),
    LANDING,
    "engagement_mutation_requests",
    "gdpr_audit",
    "profile_erasure_audit",
    "profile_suppressed_records",
    *(f"profile_raw/{tenant}" for tenant in TENANTS),
)
TABLE_LINE = re.compile(r"^  (?P<table>[\w/]+)[^:]*: expected (?P<expected>\d+)(?: records)?, found \d+(?P<rest>.*)$")
EXACT = (
    re.compile(r"^: lost 0, duplicated 0, wrong 0, unexpected 0$"),  # keyed tables
    re.compile(r"^; error rows stored twice 0; by reason \(expected, found\) where they differ: none$"),  # quarantines
    re.compile(r"^; by stream \(expected, found\) where they differ: none$"),  # profile_suppressed_records
)


def run_soak(options: dict[str, str | None], timeout_min: float) -> tuple[subprocess.CompletedProcess, str]:
    """Run the soak with `options`; keep its report; return the process and the report's tail."""
    command = [sys.executable, "-u", "-m", "benchmarks.soak"]
    for name, value in options.items():
        command += [name] if value is None else [name, value]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_min * 60)
    out = done.stdout + done.stderr
    report = REPO / ".state" / f"soak-{options['--seed']}" / "report.txt"
    report.parent.mkdir(parents=True, exist_ok=True)  # a soak that failed before making its folder
    report.write_text(out)
    return done, out[-6000:]


def injected_kinds(stdout: str) -> list[str]:
    """The kind of every fault the soak injected (its `fault <kind>: injected <seconds>, ...` lines)."""
    return re.findall(r"^fault (\w+): injected \d", stdout, flags=re.M)


def table_verdicts(stdout: str) -> dict[str, tuple[int, bool]]:
    """Per table of the report's `== tables ==` section: (rows or records the oracle expects, whether it matched)."""
    section = stdout.split("\n== tables ==\n", 1)[-1]
    verdicts = {}
    for line in section.splitlines():
        found = TABLE_LINE.match(line)
        if found:
            exact = any(pattern.match(found["rest"]) for pattern in EXACT)
            verdicts[found["table"]] = (int(found["expected"]), exact)
    return verdicts


def assert_reconciled(done: subprocess.CompletedProcess, tail: str) -> None:
    assert re.search(r"^PASS \(\d+ messages, \d+ faults\)$", done.stdout, flags=re.M), tail
    assert done.returncode == 0, tail
    verdicts = table_verdicts(done.stdout)
    assert sorted(verdicts) == sorted(TABLES), f"tables reconciled: {sorted(verdicts)}\n{tail}"
    assert [t for t, (_, exact) in verdicts.items() if not exact] == [], tail


@pytest.mark.stack
@pytest.mark.soak
def test_a_short_soak_injects_every_kind_of_fault_and_every_table_matches_its_oracle():
    done, tail = run_soak(SHORT, timeout_min=10)
    kinds = injected_kinds(done.stdout)
    assert sorted(set(kinds)) == sorted(KINDS), f"kinds injected: {sorted(set(kinds))}\n{tail}"
    assert_reconciled(done, tail)
    empty = [t for t, (expected, _) in table_verdicts(done.stdout).items() if expected == 0]
    assert empty == [], f"tables the workload left empty: {empty}\n{tail}"


@pytest.mark.stack
@pytest.mark.soak
@pytest.mark.matrix
def test_a_long_soak_under_20_or_more_faults_loses_duplicates_and_breaks_nothing():
    done, tail = run_soak(LONG, timeout_min=25)
    assert len(injected_kinds(done.stdout)) >= 20, f"{len(injected_kinds(done.stdout))} faults injected\n{tail}"
    assert_reconciled(done, tail)
